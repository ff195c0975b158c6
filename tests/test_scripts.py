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
