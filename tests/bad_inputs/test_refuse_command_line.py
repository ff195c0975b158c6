"""`train.py` and `evaluate.py` end bad command lines with one line naming the problem: no
traceback, nothing written to the workdir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # each case runs train.py or evaluate.py

REPO = Path(__file__).parent.parent.parent
SMOKE = "--config=configs/minilm_mr.py:smoke"

CASES = [
    pytest.param(["train.py", SMOKE, "--config.train.epochz=3"],
                 "unknown config key train.epochz; valid keys: ", id="misspelt key"),
    pytest.param(["train.py", SMOKE, "--config.train.batch_size=0", "--config.data_dir={tmp}/x"],
                 "train.batch_size must be positive", id="batch size 0"),
    pytest.param(["evaluate.py", SMOKE], "no run of this experiment", id="evaluate before train"),
    pytest.param(["train.py", "--config=configs/nope.py", "--config.x=1"],
                 "config file configs/nope.py not found", id="missing config file"),
    pytest.param(["train.py", SMOKE, "--config.mesh.data=4096"], "needs 4096 devices",
                 id="mesh larger than the machine"),
    pytest.param(["train.py", SMOKE, "--config.train.epochs=inf"], "train.epochs must be finite",
                 id="infinite epochs"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "fragment"), CASES)
def test_refused(args, fragment, tmp_path):
    workdir = tmp_path / "run"
    command = [sys.executable, *(a.format(tmp=tmp_path) for a in args), f"--workdir={workdir}"]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert fragment in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    written = {p.name for p in workdir.iterdir()} if workdir.exists() else set()
    assert written <= {".lock"}  # the workdir is not claimed (no config.json), nothing written
