"""TFDS builder for the embedded sentence sets, prepared as array_record (no TensorFlow).

Configs: `movie_reviews` (in-distribution: the 10,605 Rotten Tomatoes sentences SST was built
from; ids 1..5152 positive, 5153..10605 negative) and the OOD sets `nyt_editorials` (5,190),
`tweets` (4,200) and `amazon_reviews` (3,708). Splits are fixed permutations from
`numpy.random.default_rng(0)`: movie reviews 1,600 test / 1,000 validation / rest train; each
OOD set 20% validation (used only for circuit search) / 80% test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from hydra_jax import extras
from hydra_jax.data.dataset import NO_LABEL
from hydra_jax.data.sources import (
    SOURCE_ARCHIVE,
    Row,
    default_data_dir,
    fetch_command,
    read_rows,
    source_dir,
)

tfds = extras.studies_import("tensorflow_datasets", "the embedded text sets (hydra_jax.data.load)")

NUM_POSITIVE = 5152  # movieReviewSnippets ids 1..5152 are positive, the rest negative
ID_TEST, ID_VALIDATION = 1600, 1000
OOD_VALIDATION_FRACTION = 0.2


@dataclasses.dataclass(eq=False)
class SentenceConfig(tfds.core.BuilderConfig):
    corpus: str = ""
    in_distribution: bool = False


def split_indices(n: int, in_distribution: bool) -> dict[str, np.ndarray]:
    """The fixed split of `n` rows."""
    order = np.random.default_rng(0).permutation(n)
    if in_distribution:
        return {
            "test": order[:ID_TEST],
            "validation": order[ID_TEST : ID_TEST + ID_VALIDATION],
            "train": order[ID_TEST + ID_VALIDATION :],
        }
    cut = round(OOD_VALIDATION_FRACTION * n)
    return {"validation": order[:cut], "test": order[cut:]}


def sentiment_label(row: Row) -> int:
    return 1 if int(row.id) <= NUM_POSITIVE else 0


class VaderSentences(tfds.core.GeneratorBasedBuilder):
    """The VADER ground-truth sentence sets (Hutto & Gilbert, ICWSM 2014)."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [  # noqa: RUF012 (the TFDS API)
        SentenceConfig(name="movie_reviews", corpus="movieReviewSnippets", in_distribution=True),
        SentenceConfig(name="nyt_editorials", corpus="nytEditorialSnippets"),
        SentenceConfig(name="tweets", corpus="tweets"),
        SentenceConfig(name="amazon_reviews", corpus="amazonReviewSnippets"),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"Place {SOURCE_ARCHIVE} (the vadersentiment sdist) here."

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "id": tfds.features.Text(),
                    "text": tfds.features.Text(),
                    "rating": np.float32,
                    "label": np.int64,
                }
            ),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
        archive = Path(dl_manager.manual_dir) / SOURCE_ARCHIVE
        rows = read_rows(archive, self.builder_config.corpus)
        splits = split_indices(len(rows), self.builder_config.in_distribution)
        return {
            name: self._generate_examples([rows[i] for i in idx]) for name, idx in splits.items()
        }

    def _generate_examples(self, rows: list[Row]):
        in_distribution = self.builder_config.in_distribution
        for row in rows:
            label = sentiment_label(row) if in_distribution else NO_LABEL
            yield row.id, {"id": row.id, "text": row.text, "rating": row.rating, "label": label}


@dataclasses.dataclass(frozen=True)
class Sentences:
    """One split, in a stable order (sorted by source id)."""

    ids: list[str]
    texts: list[str]
    labels: np.ndarray  # [N] int64; NO_LABEL for OOD sets

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, index: np.ndarray) -> Sentences:
        return Sentences(
            [self.ids[i] for i in index], [self.texts[i] for i in index], self.labels[index]
        )


def prepare(data_dir: Path | None = None) -> Path:
    """Prepares every config as array_record under `data_dir/tfds` from the local sdist.

    Idempotent; never touches the network (the source is a manual download, and TFDS's GCS
    mirror is switched off).
    """
    data_dir = Path(data_dir or default_data_dir())
    archive = source_dir(data_dir) / SOURCE_ARCHIVE
    if not archive.is_file():
        raise FileNotFoundError(
            f"source archive {archive} not found; fetch it with: {fetch_command(data_dir)}"
        )
    config = tfds.download.DownloadConfig(
        manual_dir=str(archive.parent), try_download_gcs=False, verify_ssl=False
    )
    for builder_config in VaderSentences.BUILDER_CONFIGS:
        builder = VaderSentences(
            config=builder_config.name, data_dir=str(data_dir / "tfds"), file_format="array_record"
        )
        if not builder.is_prepared():
            builder.download_and_prepare(download_config=config)
    return data_dir / "tfds"


def load(name: str, split: str, data_dir: Path | None = None) -> Sentences:
    """Reads one split with `tfds.data_source` (no TensorFlow), preparing it first if needed."""
    data_dir = Path(data_dir or default_data_dir())
    if name not in {c.name for c in VaderSentences.BUILDER_CONFIGS}:
        raise ValueError(f"unknown sentence set {name!r}")
    prepare(data_dir)
    source = tfds.data_source(
        f"vader_sentences/{name}", split=split, data_dir=str(data_dir / "tfds"), download=False
    )
    records = source.__getitems__(range(len(source)))  # one batched read, as for images
    records.sort(key=lambda r: _sort_key(r["id"]))
    return Sentences(
        ids=[_text(r["id"]) for r in records],
        texts=[_text(r["text"]) for r in records],
        labels=np.array([r["label"] for r in records], np.int64),
    )


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _sort_key(value: bytes | str) -> tuple[int, ...]:
    return tuple(int(part) for part in _text(value).split("_"))
