"""docs/reliability.md states how many bad inputs the suite tries; the count is these modules'."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent


def test_the_reliability_page_counts_every_case():
    total = 0
    for path in sorted(HERE.glob("test_refuse_*.py")):
        spec = importlib.util.spec_from_file_location(f"counted_{path.stem}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        total += len(module.CASES)
    page = (HERE.parent.parent / "docs" / "reliability.md").read_text()
    assert f"**{total} bad inputs**" in page, (
        f"docs/reliability.md should say **{total} bad inputs**"
    )
