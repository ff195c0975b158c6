"""Fits kept by what they were fitted on: refitting on the same data fits nothing anew.

A bootstrap over test examples (`hydra-jax compare`) scores every resample with what the
evaluators fitted on undrawn data (a temperature on the validation subset, detectors on the
training subset); `fitted_once` fits each of those once per cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def digest(values: tuple) -> str:
    """A digest of arrays (their dtype, shape and bytes) and plain values (their `repr`)."""
    hashed = hashlib.blake2b(digest_size=16)
    for value in values:
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            hashed.update(f"{value.dtype}{value.shape}".encode())
            hashed.update(value.tobytes())
        else:
            hashed.update(repr(value).encode())
    return hashed.hexdigest()


def fitted_once(cache: dict[str, Any] | None, fit: Callable[..., T], *arguments: Any) -> T:
    """`fit(*arguments)`, kept in `cache` under a digest of `fit`'s name and the arguments;
    without a cache, fitted anew."""
    if cache is None:
        return fit(*arguments)
    key = digest((f"{fit.__module__}.{fit.__qualname__}", *arguments))
    if key not in cache:
        cache[key] = fit(*arguments)
    return cache[key]
