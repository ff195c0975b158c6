"""Deterministic corruptions of grey images at three severities (dataset shift, after
ImageNet-C, Hendrycks & Dietterich 2019): every function maps `uint8` `[N, H, W]` to
`uint8` `[N, H, W]` and is a pure function of (images, severity)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import ndimage

SEVERITIES = (1, 2, 3)
# Per corruption, its parameter at severities 1, 2, 3.
PARAMETERS = {
    "gaussian_noise": (0.08, 0.16, 0.32),  # noise std, in units of the [0, 1] intensity range
    "blur": (0.6, 1.0, 1.5),  # Gaussian blur sigma, pixels
    "contrast": (0.5, 0.3, 0.15),  # factor on the deviation from each image's mean
    "rotation": (15.0, 30.0, 60.0),  # degrees, counter-clockwise about the centre
}

CORRUPTIONS = tuple(PARAMETERS)


def _noise(x: np.ndarray, std: float) -> np.ndarray:
    return x + np.random.default_rng(0).normal(0.0, std, x.shape)


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma), mode="constant")


def _contrast(x: np.ndarray, factor: float) -> np.ndarray:
    mean = x.mean(axis=(1, 2), keepdims=True)
    return mean + factor * (x - mean)


def _rotation(x: np.ndarray, degrees: float) -> np.ndarray:
    return ndimage.rotate(x, degrees, axes=(2, 1), reshape=False, order=1, mode="constant")


_FUNCTIONS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "gaussian_noise": _noise,
    "blur": _blur,
    "contrast": _contrast,
    "rotation": _rotation,
}


def corrupt(images: np.ndarray, corruption: str, severity: int) -> np.ndarray:
    """`images` under `corruption` at `severity` (1..3), rounded back to `uint8`."""
    if corruption not in PARAMETERS:
        raise ValueError(f"unknown corruption {corruption!r}; known: {sorted(PARAMETERS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity}")
    x = images.astype(np.float64) / 255
    y = _FUNCTIONS[corruption](x, PARAMETERS[corruption][severity - 1])
    return np.round(np.clip(y, 0.0, 1.0) * 255).astype(np.uint8)
