"""Image data refused with what to do: sources not fetched, foreign files, wrong pixels,
crafted or damaged `.npz` archives (each named)."""

from __future__ import annotations

import gzip
import io
import re
import zipfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax.data import image_index, image_sources
from hydra_jax.data.dataset import DataError


def without_fashion_mnist(tmp: Path):
    """Reads Fashion-MNIST from a data dir without it, and no installed package to fall back on."""
    with mock.patch.object(image_sources, "SYSTEM_FASHION_MNIST", tmp / "no_system_package"):
        return image_sources.fashion_mnist(tmp / "empty", "train")


def npy_bytes(array: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """`array` as `.npy` bytes, its header claiming `shape` (default: its own)."""
    buffer = io.BytesIO()
    header = {"descr": array.dtype.str, "fortran_order": False, "shape": shape or array.shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    buffer.write(array.tobytes())
    return buffer.getvalue()


def open_npz(path: Path, members: dict[str, bytes]):
    """Opens an archive of `members` (each stored as given) as an image set."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return image_index.open_npz(path, labelled="labels.npy" in members)


def open_cut_npz(path: Path, keep: float):
    """Opens a good archive of 50 images cut to the fraction `keep` of its bytes."""
    np.savez(path, images=np.zeros((50, 10, 10), np.uint8), labels=np.arange(50))
    path.write_bytes(path.read_bytes()[: int(keep * path.stat().st_size)])
    return image_index.open_npz(path, labelled=True)


def open_large_compressed_npz(path: Path):
    """A compressed `images` of 40,000 bytes, the bound on reading one whole set to 10,000."""
    np.savez_compressed(path, images=np.zeros((100, 20, 20), np.uint8))
    with mock.patch.object(image_index, "MAX_WHOLE_BYTES", 10_000):
        return image_index.open_npz(path, labelled=False)


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
    pytest.param(
        # 8 rows claimed over 4 stored, then another member: rows 4-7 would be its bytes.
        lambda c: open_npz(
            c.tmp / "crafted.npz",
            {
                "images.npy": npy_bytes(np.zeros((4, 5, 5), np.uint8), (8, 5, 5)),
                "labels.npy": npy_bytes(np.arange(8)),
                "other.npy": npy_bytes(np.full((100, 5, 5), 7, np.uint8)),
            },
        ),
        DataError,
        "crafted.npz: 'images' says [8, 5, 5] (200 bytes after its 128-byte header), but the "
        "archive stores 228 bytes",
        id=".npz images header claiming more rows than stored",
    ),
    pytest.param(
        lambda c: open_npz(
            c.tmp / "negative.npz",
            {
                "images.npy": npy_bytes(np.zeros((4, 5, 5), np.uint8), (4, -5, 5)),
            },
        ),
        DataError,
        "negative.npz: 'images' has a dimension below 1: [4, -5, 5]",
        id=".npz images of a negative dimension",
    ),
    pytest.param(
        lambda c: open_large_compressed_npz(c.tmp / "packed.npz"),
        DataError,
        "packed.npz: 'images' is compressed",
        id=".npz images compressed and over the bound on reading whole",
    ),
    pytest.param(
        lambda c: open_cut_npz(c.tmp / "half.npz", 0.5),
        DataError,
        "half.npz: not a readable .npz archive",
        id="truncated .npz",
    ),
    pytest.param(
        lambda c: image_index.open_npz(c.write("zeros.npz", b"PK\x03\x04" + bytes(200)), True),
        DataError,
        "zeros.npz: not a readable .npz archive",
        id="damaged .npz",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
