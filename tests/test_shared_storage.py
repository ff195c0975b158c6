"""Shared storage, probed as a reviewer would: runs with other checkpoints (and the same one)
building and reading one pixel cache at once, one of them killed in the middle. Crafted and
damaged `.npz` archives are among the refused inputs of `tests/bad_inputs/test_refuse_data.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hydra_jax.data import image_index, pixel_cache

REPO = Path(__file__).parent.parent


def processor_checkpoint(path: Path, size: int) -> Path:
    transformers = pytest.importorskip("transformers")
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "vit", "num_channels": 3}))
    processor = transformers.ViTImageProcessor(
        size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor.save_pretrained(path)
    return path


def run(folder: Path, checkpoint: Path, cache: Path, delay: float) -> subprocess.Popen:
    script = REPO / "tests" / "pixel_cache_run.py"
    return subprocess.Popen(
        [sys.executable, str(script), str(folder), str(checkpoint), str(cache), str(delay)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip


@pytest.mark.processes
def test_runs_with_other_checkpoints_share_one_cache_while_one_is_killed(tmp_path):
    """Three runs at once on one folder: checkpoints A, B and A again (one entry each for A and
    B; both A runs build it, the first to finish publishes it), and a fourth run of A killed
    while it writes. Every finished run reads exactly its processor's pixels; the killed run's
    temporary file is left until it is stale, and then removed."""
    folder, cache = tmp_path / "folder", tmp_path / "cache"
    images = np.random.default_rng(0).integers(0, 256, (8, 10, 12, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        (folder / ("cat" if i % 2 else "dog")).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / ("cat" if i % 2 else "dog") / f"{i}.png")
    a = processor_checkpoint(tmp_path / "a", 8)
    b = processor_checkpoint(tmp_path / "b", 6)
    killed = run(folder, a, cache, 5.0)  # 40 s to build: killed long before
    deadline = time.time() + 120
    while not list(cache.glob(".*.tmp")) and time.time() < deadline:
        time.sleep(0.1)
    runs = [run(folder, a, cache, 0.3), run(folder, b, cache, 0.3), run(folder, a, cache, 0.2)]
    time.sleep(1.0)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    outputs = [r.communicate(timeout=300) for r in runs]
    for r, (out, err) in zip(runs, outputs, strict=True):
        assert r.returncode == 0 and out.startswith("ok "), err[-2000:]
    keys = [out.split()[1] for out, _ in outputs]
    assert keys[0] == keys[2] != keys[1]
    assert sorted(p.name for p in cache.glob("*.npy")) == sorted({f"{k}.npy" for k in keys})
    (stale,) = cache.glob(".*.tmp")  # the killed writer's
    pixel_cache.clean(cache)
    assert stale.exists()  # not yet stale: its writer might be alive
    old = time.time() - 2 * 86400
    os.utime(stale, (old, old))
    pixel_cache.clean(cache)
    assert not stale.exists() and len(list(cache.glob("*.npy"))) == 2


def test_a_compressed_member_within_the_bound_is_read_whole(tmp_path, monkeypatch):
    """The bound's other side (the refused side is in tests/bad_inputs)."""
    monkeypatch.setattr(image_index, "MAX_WHOLE_BYTES", 10_000)
    path = tmp_path / "small.npz"
    np.savez_compressed(path, images=np.zeros((10, 20, 20), np.uint8))  # 4,000 bytes whole
    index, _ = image_index.open_npz(path, labelled=False)
    assert index.whole is not None and len(index) == 10
