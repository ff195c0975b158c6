"""Image data refused with what to do: sources not fetched, foreign files, wrong pixels."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax.data import image_sources


def without_fashion_mnist(tmp: Path):
    """Reads Fashion-MNIST from a data dir without it, and no installed package to fall back on."""
    with mock.patch.object(image_sources, "SYSTEM_FASHION_MNIST", tmp / "no_system_package"):
        return image_sources.fashion_mnist(tmp / "empty", "train")


CASES = [
    pytest.param(
        lambda c: without_fashion_mnist(c.tmp),
        FileNotFoundError,
        "apt-get download dataset-fashion-mnist",
        id="Fashion-MNIST not fetched",
    ),
    pytest.param(
        lambda c: image_sources.small_digits(c.tmp / "empty"),
        FileNotFoundError,
        "scikit-learn==1.9.1 wheel not found",
        id="OOD wheel not fetched",
    ),
    pytest.param(
        lambda c: image_sources.read_idx(
            c.write("t.gz", gzip.compress(b"\x00\x00\x08\x01" + (9).to_bytes(4, "big") + b"abc"))
        ),
        ValueError,
        "header says (9,), data holds 3",
        id="truncated IDX file",
    ),
    pytest.param(
        lambda c: image_sources.read_idx(c.write("png.gz", gzip.compress(b"\x89PNG\r\n"))),
        ValueError,
        "not an IDX file",
        id="not an IDX file",
    ),
    pytest.param(
        lambda c: hj.data.to_pixels(np.zeros((2, 28, 28, 3), np.uint8)),
        ValueError,
        "uint8 grey images [N, H, W]",
        id="colour images as grey",
    ),
    pytest.param(
        lambda c: hj.data.to_pixels(np.zeros((2, 28, 28))),
        ValueError,
        "uint8 grey images [N, H, W]",
        id="float images as grey",
    ),
    pytest.param(
        lambda c: hj.data.corrupt(np.zeros((1, 28, 28), np.uint8), "fog", 1),
        ValueError,
        "unknown corruption",
        id="unknown corruption",
    ),
    pytest.param(
        lambda c: hj.data.corrupt(np.zeros((1, 28, 28), np.uint8), "blur", 0),
        ValueError,
        "severity must be one of",
        id="severity 0",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
