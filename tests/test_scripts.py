"""scripts/same_predictions.py: the check behind "changed no result" claims must be able to fail."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scripts import same_predictions  # the repository root is on pytest's pythonpath


def _run(tmp_path: Path, name: str, rows: list[dict], logits: np.ndarray) -> Path:
    run = tmp_path / name
    (run / "predictions").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"rows": rows, "stages": {"x": 1.0}}))
    np.savez(run / "predictions" / "single.npz", id_logits=logits)
    return run


def test_same_predictions_passes_equal_runs_and_fails_different_or_empty_ones(tmp_path):
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    rows = [{"acc": 0.5, "size": 2, "strategy": "taylor"}]
    a = _run(tmp_path, "a", rows, logits)
    b = _run(tmp_path, "b", rows, logits + 1e-7)
    assert same_predictions.main([str(a), str(b), "--atol", "1e-6"]) == 0
    c = _run(tmp_path, "c", [{"acc": 0.6, "size": 2, "strategy": "taylor"}], logits)
    assert same_predictions.main([str(a), str(c)]) == 1  # an ablation row differs
    d = _run(tmp_path, "d", rows, logits + 1e-3)
    assert same_predictions.main([str(a), str(d)]) == 1  # a prediction differs
    (d / "results.json").unlink()
    assert same_predictions.main([str(a), str(d)]) == 1  # its results are missing, not a crash
    (tmp_path / "e").mkdir()
    (tmp_path / "f").mkdir()
    assert same_predictions.main([str(tmp_path / "e"), str(tmp_path / "f")]) == 1  # nothing


def test_same_predictions_compares_head_sets_under_either_file_name(tmp_path):
    """Ablation head sets were in head_sets.json before the study engine, and are in
    ablation_head_sets.json since: a run of each compares; a different set fails."""
    sets, changed = {"M2_taylor": [[[1, 0]], [[0, 1]]]}, {"M2_taylor": [[[1, 0]], [[1, 0]]]}
    old, new, other = (tmp_path / n for n in ("old", "new", "other"))
    for run, name, value in [(old, "head_sets.json", sets),
                             (new, "ablation_head_sets.json", sets),
                             (other, "ablation_head_sets.json", changed)]:  # fmt: skip
        run.mkdir()
        (run / name).write_text(json.dumps(value))
    assert same_predictions.main([str(old), str(new)]) == 0
    assert same_predictions.main([str(old), str(other)]) == 1
    assert same_predictions.main([str(new), str(tmp_path)]) == 1  # missing
