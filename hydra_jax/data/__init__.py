"""Datasets: the `Dataset` protocol and batching, text, images (held in memory, `ImageSet`, or
decoded batch by batch from files, `ImageStream`), and the embedded TFDS builders.

The TFDS builders (`load`, `prepare`, `Sentences`) import `tensorflow_datasets`, so they are
loaded on first use: `import hydra_jax` stays free of it.
"""

import importlib
from typing import Any

from hydra_jax.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from hydra_jax.data.dataset import (
    NO_LABEL,
    Dataset,
    concat_all,
    epoch_batches,
    eval_batches,
    labelled_batches,
    subset,
    uncertainty_batches,
)
from hydra_jax.data.image_sources import IMAGE_SETS
from hydra_jax.data.image_sources import SIZE as IMAGE_SIZE
from hydra_jax.data.image_stream import ImageStream
from hydra_jax.data.images import ImageSet, image_set, to_pixels
from hydra_jax.data.sources import default_data_dir
from hydra_jax.data.text import TextEncoder, TokenizedSet, pad_batch, random_tokens

_LAZY = {
    "Sentences": "sentences",
    "load": "sentences",
    "prepare": "sentences",
    "load_images": "image_builder",
    "prepare_images": "image_builder",
}
NUM_CLASSES = {"movie_reviews": 2, "fashion_mnist": 10}  # classes of each in-distribution set


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"hydra_jax.data.{_LAZY[name]}")
        return getattr(module, "prepare" if name == "prepare_images" else name)
    raise AttributeError(f"module 'hydra_jax.data' has no attribute {name!r}")


__all__ = [
    "CORRUPTIONS",
    "IMAGE_SETS",
    "IMAGE_SIZE",
    "NO_LABEL",
    "NUM_CLASSES",
    "SEVERITIES",
    "Dataset",
    "ImageSet",
    "ImageStream",
    "Sentences",
    "TextEncoder",
    "TokenizedSet",
    "concat_all",
    "corrupt",
    "default_data_dir",
    "epoch_batches",
    "eval_batches",
    "image_set",
    "labelled_batches",
    "load",
    "load_images",
    "pad_batch",
    "prepare",
    "prepare_images",
    "random_tokens",
    "subset",
    "to_pixels",
    "uncertainty_batches",
]
