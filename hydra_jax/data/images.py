"""Images: `ImageSet`, the image `Dataset` (pixel arrays in HF layout and labels)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hydra_jax.data.dataset import Batch


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """`pixels` `[N, C, H, W]` float32 (as HF image processors produce them) and labels `[N]`.

    Every example has the same size, so batches need no padding; a short batch is filled by
    repeating its first image (callers keep the first `len(index)` rows).
    """

    pixels: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        if self.pixels.ndim != 4 or len(self.pixels) != len(self.labels):
            raise ValueError(
                f"pixels must be [N, C, H, W] with one label each; got pixels "
                f"{self.pixels.shape} and labels {self.labels.shape}"
            )

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        return np.ones(len(self), np.int64)  # one size: batching keeps the given order

    def take(self, index: np.ndarray) -> ImageSet:
        return ImageSet(self.pixels[index], self.labels[index])

    def concat(self, other: Any) -> ImageSet:
        if not isinstance(other, ImageSet) or other.pixels.shape[1:] != self.pixels.shape[1:]:
            raise TypeError("only image sets of the same image shape concatenate")
        return ImageSet(
            np.concatenate([self.pixels, other.pixels]), np.concatenate([self.labels, other.labels])
        )

    def batch(self, index: np.ndarray, batch_size: int | None = None, length: int = 0) -> Batch:
        del length  # every image has the same size
        index = np.asarray(index)
        if index.size == 0:
            raise ValueError("empty batch: no images")
        if batch_size is not None:
            index = np.r_[index, np.repeat(index[:1], batch_size - len(index))]
        return {"pixel_values": self.pixels[index].astype(np.float32), "labels": self.labels[index]}


# What `ViTImageProcessor` does with our exported `preprocessor_config.json`: rescale to [0, 1],
# then normalise with mean 0.5 and std 0.5 (so pixels lie in [-1, 1]).
PIXEL_MEAN, PIXEL_STD = 0.5, 0.5


def to_pixels(images: np.ndarray) -> np.ndarray:
    """Grey `uint8` images `[N, H, W]` -> model inputs `[N, 1, H, W]` float32 in [-1, 1]."""
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"expected uint8 grey images [N, H, W], got {images.dtype} {images.shape}")
    return ((images.astype(np.float32) / 255 - PIXEL_MEAN) / PIXEL_STD)[:, None]


def image_set(images: np.ndarray, labels: np.ndarray) -> ImageSet:
    return ImageSet(to_pixels(images), labels)
