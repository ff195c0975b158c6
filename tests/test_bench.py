"""The accelerator benchmark runs at tiny shapes, so the script a GPU or TPU user runs as is
cannot rot unnoticed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench import accelerator


def test_accelerator_bench_runs_at_tiny_shapes(capsys):
    results = accelerator.main(["--tiny", "--repeats", "1"])
    assert set(results) == {"ViT (tiny)", "BERT (tiny)"}
    for times in results.values():
        assert set(times) == {"single bfloat16", "hydra bfloat16", "deep_ensemble bfloat16"}
        assert all(t > 0 for t in times.values())
    out = capsys.readouterr().out
    assert out.count("bfloat16: hydra / single") == 2
