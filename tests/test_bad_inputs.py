"""Every in-process case of scripts/bad_inputs.py ends in a clear error (the count in
docs/reliability.md; the command-line cases are tested in test_experiments.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
import bad_inputs


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    return {label: bad_inputs.classify(call, kind, fragment)
            for label, call, kind, fragment in bad_inputs.cases(tmp)}  # fmt: skip


def test_every_bad_input_gets_a_clear_error(outcomes):
    unclear = {label: detail for label, (outcome, detail) in outcomes.items() if outcome != "clear"}
    assert not unclear
    assert len(outcomes) >= 85
