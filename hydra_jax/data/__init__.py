"""Datasets: the `Dataset` protocol and batching, text, and the embedded TFDS builders.

The TFDS builders (`load`, `prepare`, `Sentences`) import `tensorflow_datasets`, so they are
loaded on first use: `import hydra_jax` stays free of it.
"""

import importlib
from typing import Any

from hydra_jax.data.dataset import (
    Dataset,
    concat_all,
    epoch_batches,
    eval_batches,
    labelled_batches,
    subset,
    uncertainty_batches,
)
from hydra_jax.data.images import ImageSet
from hydra_jax.data.sources import default_data_dir
from hydra_jax.data.text import TextEncoder, TokenizedSet, pad_batch, random_tokens

_LAZY = {"NO_LABEL": "sentences", "Sentences": "sentences", "load": "sentences",
         "prepare": "sentences"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"hydra_jax.data.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'hydra_jax.data' has no attribute {name!r}")


__all__ = [
    "NO_LABEL",
    "Dataset",
    "ImageSet",
    "Sentences",
    "TextEncoder",
    "TokenizedSet",
    "concat_all",
    "default_data_dir",
    "epoch_batches",
    "eval_batches",
    "labelled_batches",
    "load",
    "pad_batch",
    "prepare",
    "random_tokens",
    "subset",
    "uncertainty_batches",
]
