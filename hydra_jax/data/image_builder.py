"""TFDS builder for the embedded image sets, prepared as array_record (no TensorFlow).

Configs: `fashion_mnist` (in-distribution: 10 classes; the 10,000 test images, and the 60,000
training images cut into 5,000 validation / 55,000 train by `numpy.random.default_rng(0)`) and
the OOD sets `mnist` (5,000 digits), `digits` (1,797 upsampled 8x8 digits) and `photos` (5,000
photograph patches), each 20% validation (circuit search only) / 80% test by
`default_rng(0)`. Sources: `image_sources`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hydra_jax import extras
from hydra_jax.data import image_sources
from hydra_jax.data.dataset import NO_LABEL
from hydra_jax.data.image_sources import IMAGE_SETS
from hydra_jax.data.sentences import OOD_VALIDATION_FRACTION
from hydra_jax.data.sources import default_data_dir

tfds = extras.studies_import("tensorflow_datasets", "the embedded image sets (data.load_images)")

ID_VALIDATION = 5000
_OOD_SOURCES: dict[str, Callable[[Path], np.ndarray]] = {
    "mnist": image_sources.mnist_digits,
    "digits": image_sources.small_digits,
    "photos": image_sources.photo_patches,
}


@dataclasses.dataclass(eq=False)
class ImageSetConfig(tfds.core.BuilderConfig):
    in_distribution: bool = False


def ood_split(n: int) -> dict[str, np.ndarray]:
    order = np.random.default_rng(0).permutation(n)
    cut = round(OOD_VALIDATION_FRACTION * n)
    return {"validation": np.sort(order[:cut]), "test": np.sort(order[cut:])}


class HydraImageSets(tfds.core.GeneratorBasedBuilder):
    """Fashion-MNIST and three OOD image sets from registry packages."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [  # noqa: RUF012 (the TFDS API)
        ImageSetConfig(name="fashion_mnist", in_distribution=True),
        *(ImageSetConfig(name=name) for name in _OOD_SOURCES),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Run `make setup` (see hydra_jax.data.image_sources)."

    def _info(self) -> tfds.core.DatasetInfo:
        size = image_sources.SIZE
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "index": np.int64,  # position in the source, for a stable order
                    "image": tfds.features.Tensor(shape=(size, size), dtype=np.uint8),
                    "label": np.int64,
                }
            ),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
        data_dir = Path(dl_manager.manual_dir).parent  # manual_dir is data_dir/downloads
        name = self.builder_config.name
        if name == "fashion_mnist":
            train_images, train_labels = image_sources.fashion_mnist(data_dir, "train")
            test_images, test_labels = image_sources.fashion_mnist(data_dir, "test")
            order = np.random.default_rng(0).permutation(len(train_images))
            validation, train = np.sort(order[:ID_VALIDATION]), np.sort(order[ID_VALIDATION:])
            return {
                "train": self._generate_examples(train_images, train_labels, train),
                "validation": self._generate_examples(train_images, train_labels, validation),
                "test": self._generate_examples(
                    test_images, test_labels, np.arange(len(test_images))
                ),
            }
        images = _OOD_SOURCES[name](data_dir)
        labels = np.full(len(images), NO_LABEL, np.int64)
        return {
            split: self._generate_examples(images, labels, index)
            for split, index in ood_split(len(images)).items()
        }

    def _generate_examples(self, images: np.ndarray, labels: np.ndarray, index: np.ndarray):
        for i in index:
            yield int(i), {"index": int(i), "image": images[i], "label": int(labels[i])}


def prepare(data_dir: Path | None = None) -> Path:
    """Prepares every image set as array_record under `data_dir/tfds`; idempotent, offline."""
    data_dir = Path(data_dir or default_data_dir())
    config = tfds.download.DownloadConfig(
        manual_dir=str(image_sources.source_dir(data_dir)), try_download_gcs=False
    )
    for name in IMAGE_SETS:
        builder = HydraImageSets(
            config=name, data_dir=str(data_dir / "tfds"), file_format="array_record"
        )
        if not builder.is_prepared():
            builder.download_and_prepare(download_config=config)
    return data_dir / "tfds"


def load_images(
    name: str, split: str, data_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`(images [N, 28, 28] uint8, labels [N] int64)` of one split, in source order, read with
    `tfds.data_source` (prepared first if needed)."""
    data_dir = Path(data_dir or default_data_dir())
    if name not in IMAGE_SETS:
        raise ValueError(f"unknown image set {name!r}; known: {list(IMAGE_SETS)}")
    prepare(data_dir)
    source = tfds.data_source(
        f"hydra_image_sets/{name}", split=split, data_dir=str(data_dir / "tfds"), download=False
    )
    records = source.__getitems__(range(len(source)))
    records = sorted(records, key=lambda r: int(r["index"]))
    images = np.stack([r["image"] for r in records])
    return images, np.array([r["label"] for r in records], np.int64)
