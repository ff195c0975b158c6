"""What the bad-input cases share: tiny models, good inputs to spoil, a scratch directory.

Each case is `pytest.param(call, error, fragment, id=...)`: `call(c)` with the `c` below must
raise `error` with `fragment` in its message (docs/reliability.md counts them).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import testing


class Context:
    """The models and inputs a module's cases spoil; the models are built on first use."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        rng = np.random.default_rng(0)
        self.ids = rng.integers(1, 50, (3, 6)).astype(np.int32)
        self.mask = np.ones_like(self.ids)
        self.good = {"input_ids": self.ids, "attention_mask": self.mask}
        self.pixels = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
        self.probs = np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
        self.labels = np.array([1, 0, 1])

    @cached_property
    def bert(self) -> hj.Model:
        """2 layers x 4 heads, vocabulary 50, 12 positions, a 3-way classifier."""
        return hj.with_classifier(testing.tiny(testing.bert(mlp_dim=20)), 3, jax.random.key(1))

    @cached_property
    def vit(self) -> hj.Model:
        """1 layer x 2 heads on 8-pixel images, a 2-way classifier."""
        return testing.tiny(testing.vit(layers=1, heads=2, num_labels=2), seed=2)

    @cached_property
    def clip(self) -> hj.Model:
        """1 layer x 2 heads per tower, vocabulary 30."""
        tower = {"layers": 1, "heads": 2}
        return testing.tiny(testing.clip(text=tower, vision=tower), seed=3)

    @cached_property
    def saved_bert(self) -> Path:
        hj.save_pretrained(self.bert, self.tmp / "bert")
        return self.tmp / "bert"

    def write(self, name: str, data: bytes) -> Path:
        """A file of `data` in the scratch directory."""
        (self.tmp / name).write_bytes(data)
        return self.tmp / name

    def edited(
        self,
        name: str,
        config: Callable[[Any], Any] | None = None,
        tensors: Callable[[dict], dict] | None = None,
        remove: str | None = None,
    ) -> Path:
        """A copy of the saved BERT with its config and tensors edited, or a file removed."""
        from safetensors.numpy import load_file, save_file

        path = self.tmp / name
        shutil.copytree(self.saved_bert, path)
        hf = json.loads((path / "config.json").read_text())
        weights = load_file(path / "model.safetensors")
        hf = config(hf) if config else hf
        weights = tensors(weights) if tensors else weights
        (path / "config.json").write_text(hf if isinstance(hf, str) else json.dumps(hf))
        save_file(weights, path / "model.safetensors")
        if remove:
            (path / remove).unlink()
        return path


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Context:
    return Context(tmp_path_factory.mktemp("bad"))
