"""A workdir is held by one run at a time; the second is refused and the first loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_jax.experiments.common import LOCK_FILE, WorkdirError, hold_workdir

REPO = Path(__file__).parent.parent


def test_a_held_workdir_refuses_a_second_holder_and_is_free_after(tmp_path):
    workdir = tmp_path / "run"
    with hold_workdir(workdir):
        (workdir / "checkpoint").write_text("the first run's work")
        held = rf"{workdir} is in use by process {os.getpid()} "
        with pytest.raises(WorkdirError, match=held), hold_workdir(workdir):
            pass
    assert (workdir / "checkpoint").read_text() == "the first run's work"
    with hold_workdir(workdir):  # released when its holder ends: no stale lock
        pass
    with hold_workdir(tmp_path / "absent", create=False):
        pass
    assert not (tmp_path / "absent").exists()


def test_a_second_train_py_on_a_running_workdir_is_refused(tmp_path):
    workdir = tmp_path / "run"
    with hold_workdir(workdir):  # as a running train.py holds it
        (workdir / "config.json").write_text("{}")
        second = subprocess.run(
            [sys.executable, "train.py", "--config=configs/minilm_mr.py:smoke",
             f"--workdir={workdir}"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert second.returncode == 2, second.stderr
    assert f"error: {workdir} is in use by process {os.getpid()} on " in second.stderr
    assert sorted(p.name for p in workdir.iterdir()) == [LOCK_FILE, "config.json"]
    assert (workdir / "config.json").read_text() == "{}"
