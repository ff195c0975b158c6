"""Data a researcher has: text tables, image folders and arrays, prepared TFDS and HF datasets.

A *source* names one split as `KIND:LOCATION`:

| spec | what it reads |
|---|---|
| `csv:PATH`, `tsv:PATH` | a text table with a header row, one example per row |
| `jsonl:PATH` | JSON Lines, one object per line |
| `parquet:PATH` | a Parquet table |
| `folder:DIR` | images, one subfolder per class (`DIR/CLASS/*.png`, `.jpg`, `.jpeg`) |
| `npz:PATH` | `images` `[N, H, W]` or `[N, H, W, C]` uint8, optional `labels` `[N]` |
| `tfds:NAME:SPLIT` | a TFDS dataset already prepared in the data dir (never downloaded) |
| `hf:DIR[:SPLIT]` | a HuggingFace `datasets` dataset written by `save_to_disk` |

Text columns come from `Columns` (default `text` and `label`, and `pair` for sentence pairs
when set); images are the `image` feature of TFDS and HF datasets. Labels may be integers or
strings: `ClassNames` maps both to class indices, the same way for every split. An OOD set needs
no labels.

`read` gives the raw examples (`RawSplit`): texts read column by column (Arrow's columns for
Parquet and HF data), images as an index that decodes image i when it is asked for
(`hydra_jax.data.image_index`: a folder's files, an archive's rows, a dataset's records).
`to_dataset` tokenises texts with the checkpoint's tokenizer into a `TokenizedSet`, and makes
images an `ImageStream`, which runs the checkpoint's image processor (`preprocessor_config.json`,
through `transformers`) batch by batch. What can be checked without decoding every image
(files, extensions, headers, labels, array shapes) is checked by `read` and `to_dataset`, before
any training, naming the file and what is wrong with it; an image that fails to decode later
stops the run with its name.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from hydra_jax import extras
from hydra_jax.data import image_index
from hydra_jax.data.dataset import NO_LABEL, DataError
from hydra_jax.data.image_index import Images, Subset
from hydra_jax.data.image_stream import Decoded, ImageStream, Preprocessor
from hydra_jax.data.text import TextEncoder, TokenizedSet

TEXT_KINDS = ("csv", "tsv", "jsonl", "parquet")
IMAGE_KINDS = ("folder", "npz")
KINDS = (*TEXT_KINDS, *IMAGE_KINDS, "tfds", "hf")
IMAGE_SUFFIXES = image_index.IMAGE_SUFFIXES
RECORD_CHUNK = 4096  # records of a TFDS dataset read at a time
TOKENIZE_CHUNK = 20_000  # texts tokenised at a time (a progress bar counts them)


@dataclasses.dataclass(frozen=True)
class Source:
    """One split: `kind` (one of `KINDS`), `location` (a path, or a TFDS name), `split`."""

    kind: str
    location: str
    split: str = ""

    @classmethod
    def parse(cls, spec: str) -> Source:
        """`KIND:LOCATION` (`tfds:NAME:SPLIT`, `hf:DIR[:SPLIT]`) as a `Source`."""
        kind, sep, rest = str(spec).partition(":")
        if not sep or kind not in KINDS or not rest:
            raise DataError(
                f"data source {spec!r} is not KIND:LOCATION with KIND one of {', '.join(KINDS)} "
                "(e.g. csv:train.csv, folder:images/, tfds:NAME:SPLIT, hf:DIR:SPLIT)"
            )
        if kind == "tfds":
            name, sep, split = rest.partition(":")
            if not sep or not name or not split:
                raise DataError(f"data source {spec!r}: a TFDS source is tfds:NAME:SPLIT")
            return cls(kind, name, split)
        if kind == "hf":
            location, _, split = rest.rpartition(":") if _has_split(rest) else (rest, "", "")
            return cls(kind, location, split)
        return cls(kind, rest)

    def __str__(self) -> str:
        return f"{self.kind}:{self.location}" + (f":{self.split}" if self.split else "")


def _has_split(rest: str) -> bool:
    """Whether `hf:` LOCATION ends in `:SPLIT` (a path may hold colons only before the split)."""
    head, sep, tail = rest.rpartition(":")
    return bool(sep and head and tail and "/" not in tail and not Path(rest).exists())


@dataclasses.dataclass(frozen=True)
class Columns:
    """Where a table keeps its text, second text (sentence pairs; "" for none) and label."""

    text: str = "text"
    pair: str = ""
    label: str = "label"


@dataclasses.dataclass(frozen=True)
class RawSplit:
    """Examples as read: `texts` (and `pairs`), or `images` (an index: image i, `uint8`
    `[H, W]` or `[H, W, C]`, decoded when asked for; a list of arrays is one too), and raw
    `labels` (ints or strings; None where the source has none)."""

    origin: str
    texts: list[str] | None = None
    pairs: list[str] | None = None
    images: Images | None = None
    labels: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.images or [])

    @property
    def is_images(self) -> bool:
        return self.images is not None

    def take(self, index: np.ndarray) -> RawSplit:
        """The examples `index`, in that order (images stay undecoded)."""
        index = np.asarray(index, np.int64)

        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in index]

        images = None if self.images is None else Subset(self.images, index)
        return RawSplit(self.origin, pick(self.texts), pick(self.pairs), images, pick(self.labels))


# ----------------------------------------------------------------------------- reading


def read(
    source: Source | str,
    columns: Columns = Columns(),
    data_dir: Path | None = None,
    labelled: bool = True,
    progress: bool = True,
) -> RawSplit:
    """The examples of `source`; with `labelled`, its labels are required. Images are indexed,
    not decoded: a folder's files are listed and their headers read.

    Raises:
      DataError: a missing file or column, an unreadable image header, an empty split, ...
        (named).
    """
    source = Source.parse(source) if isinstance(source, str) else source
    if source.kind != "tfds" and not Path(source.location).exists():
        raise DataError(f"{source}: {source.location} does not exist")
    if source.kind in TEXT_KINDS:
        split = _read_table(source, columns, labelled)
    elif source.kind == "folder":
        images, labels = image_index.open_folder(Path(source.location), progress)
        split = RawSplit(source.location, images=images, labels=labels)
    elif source.kind == "npz":
        images, labels = image_index.open_npz(Path(source.location), labelled)
        split = RawSplit(source.location, images=images, labels=labels)
    elif source.kind == "tfds":
        split = _read_tfds(source, columns, data_dir, labelled, progress)
    else:
        split = _read_hf(source, columns, labelled)
    if len(split) == 0:
        raise DataError(f"{split.origin}: no examples (an empty split)")
    return split


def _read_table(source: Source, columns: Columns, labelled: bool) -> RawSplit:
    path = Path(source.location)
    wanted = [c for c in (columns.text, columns.pair, columns.label) if c]
    values: dict[str, list[Any]] = {}
    if source.kind in ("csv", "tsv"):
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="," if source.kind == "csv" else "\t")
            header = list(reader.fieldnames or [])
            values = {c: [] for c in wanted if c in header}
            for row in reader:
                for c, column in values.items():
                    column.append(row.get(c))
    elif source.kind == "jsonl":
        values = {c: [] for c in wanted}
        seen: set[str] = set()
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}: line {number} is not JSON ({error.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}: line {number} is not a JSON object")
                seen.update(row)
                for c, column in values.items():
                    column.append(row.get(c))
        header = sorted(seen)
    else:
        pq = extras.studies_import("pyarrow.parquet", "parquet: data files")

        try:
            schema = pq.read_schema(path)
            header = list(schema.names)
            table = pq.read_table(path, columns=[c for c in wanted if c in header])
        except Exception as error:  # pyarrow's own kinds: not a Parquet file, corrupt, ...
            raise DataError(f"{path}: not a readable Parquet table ({error})") from None
        values = {c: table.column(c).to_pylist() for c in table.column_names}
    return _text_split(values, str(path), columns, labelled, header)


def _text_split(
    values: dict[str, list[Any]],
    origin: str,
    columns: Columns,
    labelled: bool,
    header: Sequence[str],
) -> RawSplit:
    """Columns of a table or dataset (`values`: name -> one value per row) as a `RawSplit`."""
    texts = _column(values, columns.text, origin, header, text=True)
    pairs = _column(values, columns.pair, origin, header, text=True) if columns.pair else None
    labels = _column(values, columns.label, origin, header) if labelled else None
    return RawSplit(origin, texts=texts, pairs=pairs, labels=labels)


def _column(
    values: dict[str, list[Any]],
    name: str,
    origin: str,
    header: Sequence[str],
    text: bool = False,
    rows: int | None = None,
) -> list[Any]:
    """The column `name` of `values`, each value checked (`rows`: the split's size, where
    `values` may hold no column)."""
    if rows is None:
        rows = max((len(column) for column in values.values()), default=0)
    if rows and name not in header:
        raise DataError(f"{origin}: no column {name!r} (its columns: {', '.join(header)})")
    out = list(values.get(name, [None] * rows))
    for i, value in enumerate(out):
        if isinstance(value, bytes):
            value = out[i] = value.decode("utf-8")
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"{origin}: row {i + 1} has no {name!r}")
        if text and not isinstance(value, str):
            raise DataError(f"{origin}: row {i + 1}'s {name!r} is not text: {value!r}")
    return out


def _read_tfds(
    source: Source, columns: Columns, data_dir: Path | None, labelled: bool, progress: bool
) -> RawSplit:
    """A prepared TFDS dataset's split (never downloaded): an `image` feature as an index of
    its records (each image decoded when asked for), else its text columns."""
    tfds = extras.studies_import("tensorflow_datasets", "tfds: data sources")
    from hydra_jax.data.sources import default_data_dir

    root = Path(data_dir or default_data_dir()) / "tfds"
    origin = f"tfds:{source.location}:{source.split} in {root}"

    def open_source(**decoders: Any) -> Any:
        try:
            return tfds.data_source(
                source.location,
                split=source.split,
                data_dir=str(root),
                download=False,
                decoders=decoders or None,
            )
        except Exception as error:  # TFDS raises its own kinds for a missing dataset or split
            raise DataError(f"{origin}: not a prepared TFDS dataset and split ({error})") from None

    records = open_source()
    features = records.dataset_info.features
    header = list(features.keys())
    is_images = "image" in header and columns.text not in header
    if is_images and isinstance(features["image"], tfds.features.Image):
        records = open_source(image=tfds.decode.SkipDecoding())  # encoded: decoded when read
    wanted = [columns.label] if is_images else [columns.text, columns.pair, columns.label]
    values: dict[str, list[Any]] = {c: [] for c in wanted if c and c in header}
    starts = range(0, len(records), RECORD_CHUNK)
    quiet = not progress or len(records) <= RECORD_CHUNK
    for start in tqdm(starts, desc=f"index {source}", leave=False, disable=quiet):
        chunk = records.__getitems__(range(start, min(start + RECORD_CHUNK, len(records))))
        for c, column in values.items():
            column += [record[c] for record in chunk]
    if not is_images:
        return _text_split(values, origin, columns, labelled, header)
    files = sorted(Path(str(records.dataset_info.data_dir)).glob("*"))
    images = image_index.RecordImages(records, origin, image_index.files_fingerprint(files))
    labels = _column(values, columns.label, origin, header, rows=len(records)) if labelled else None
    return RawSplit(origin, images=images, labels=labels)


class _Reopened:
    """The `image` column of a saved HF dataset, opened again after every `every` rows read:
    a dataset is a memory map of its Arrow files, and the pages a pass reads would otherwise
    stay in the process's resident memory (as much as the files hold)."""

    def __init__(self, source: Source, rows: int, every: int = 512):
        self.source, self.rows, self.every = source, rows, every
        self._lock = threading.Lock()
        self._records: Any = None
        self._reads = 0

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, Any]:
        with self._lock:
            if self._records is None or self._reads >= self.every:
                self._records, self._reads = None, 0  # the old map is released with its rows
                self._records = _load_hf(self.source).select_columns(["image"])
                self._records = self._records.with_format("numpy")
            self._reads += 1
            records = self._records
        return records[i]


def _load_hf(source: Source) -> Any:
    """The split of a dataset written by `save_to_disk` (the whole dataset where it has none)."""
    datasets = extras.studies_import("datasets", "hf: data sources")
    try:
        loaded = datasets.load_from_disk(source.location)
    except FileNotFoundError as error:
        raise DataError(f"{source}: not a dataset written by save_to_disk ({error})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if source.split not in loaded:
            raise DataError(f"{source}: no split {source.split!r} (it has {', '.join(loaded)})")
        return loaded[source.split]
    if source.split:
        raise DataError(f"{source}: a single dataset has no splits; drop ':{source.split}'")
    return loaded


def _read_hf(source: Source, columns: Columns, labelled: bool) -> RawSplit:
    """A saved HF dataset's split: an `image` column as an index of its rows (each decoded
    when asked for), else its text columns (Arrow's columns, no row dicts)."""
    origin = str(source)
    loaded = _load_hf(source)
    header = loaded.column_names
    if "image" in header and columns.text not in header:
        values = {c: list(loaded[c]) for c in [columns.label] if labelled and c in header}
        rows = len(loaded)
        labels = _column(values, columns.label, origin, header, rows=rows) if labelled else None
        files = [Path(f["filename"]) for f in loaded.cache_files]
        fingerprint = image_index.files_fingerprint(files) if files else loaded._fingerprint
        records = _Reopened(source, rows)
        images = image_index.RecordImages(records, origin, f"{fingerprint}:{rows}")
        return RawSplit(origin, images=images, labels=labels)
    wanted = [c for c in (columns.text, columns.pair, columns.label) if c and c in header]
    values = {c: list(loaded[c]) for c in wanted}
    return _text_split(values, origin, columns, labelled, header)


# ----------------------------------------------------------------------------- labels


@dataclasses.dataclass(frozen=True)
class ClassNames:
    """Class names in index order: the checkpoint's `id2label`, else the training labels'.

    `encode` maps a label to its index: a class name, or an integer in range (also as text, as
    CSV files hold it).
    """

    names: tuple[str, ...]

    @classmethod
    def build(
        cls,
        train_labels: Sequence[Any],
        id2label: dict[int, str] | None = None,
        origin: str = "the training split",
    ) -> ClassNames:
        """From the checkpoint's classifier (`id2label`) where it has one, else from the
        training split: its sorted names, or, for integer labels, `0 .. max`."""
        if id2label:
            return cls(tuple(id2label[i] for i in range(len(id2label))))
        if all(_as_int(v) is not None for v in train_labels):
            top = max(_as_int(v) for v in train_labels)
            if top < 0:
                raise DataError(f"{origin}: labels must be class indices >= 0")
            return cls(tuple(str(i) for i in range(top + 1)))
        return cls(tuple(sorted({str(v) for v in train_labels})))

    def encode(self, labels: Sequence[Any], origin: str) -> np.ndarray:
        """`[N]` int64 class indices of `labels` (read from `origin`, named in errors)."""
        index = {name: i for i, name in enumerate(self.names)}
        out = np.empty(len(labels), np.int64)
        for row, value in enumerate(labels):
            if isinstance(value, str) and value in index:
                out[row] = index[value]
                continue
            number = _as_int(value)
            if number is None:
                raise DataError(
                    f"{origin}: row {row + 1} has label {value!r}, not one of the "
                    f"{len(self.names)} classes {list(self.names)}"
                )
            C = len(self.names)
            if not 0 <= number < C:
                raise DataError(
                    f"{origin}: row {row + 1} has label {number}, outside the "
                    f"classifier's {C} classes 0..{C - 1}"
                )
            out[row] = number
        return out


def checkpoint_id2label(checkpoint: Path) -> dict[int, str] | None:
    """The class names of a checkpoint's classifier (`id2label` in its `config.json`); None
    where it has none or only `transformers`' placeholders (`LABEL_0`, `LABEL_1`, ...)."""
    config_file = Path(checkpoint) / "config.json"
    if not config_file.is_file():
        return None
    id2label = {
        int(k): str(v) for k, v in json.loads(config_file.read_text()).get("id2label", {}).items()
    }
    if not id2label or all(v == f"LABEL_{k}" for k, v in id2label.items()):
        return None
    if sorted(id2label) != list(range(len(id2label))):
        raise DataError(f"{config_file}: id2label keys must be 0..{len(id2label) - 1}")
    return id2label


def _as_int(value: Any) -> int | None:
    """An integer label (an int, an integral NumPy scalar, or decimal text), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


# ----------------------------------------------------------------------------- preprocessing


def to_dataset(
    split: RawSplit,
    checkpoint: Path,
    classes: ClassNames | None,
    encoder: TextEncoder | None = None,
    preprocess: Preprocessor | None = None,
) -> TokenizedSet | ImageStream:
    """`split` as the checkpoint's files say, labelled by `classes` (None: an OOD set, every
    label `NO_LABEL`): texts tokenised now, images an `ImageStream` that decodes and runs the
    image processor (`preprocess`, default the checkpoint's) batch by batch.

    Raises:
      DataError: a label outside the classes; images the model cannot take, where that is
        known without decoding them (channels, sizes the processor does not resize).
    """
    if classes is None or split.labels is None:
        labels = np.full(len(split), NO_LABEL, np.int64)
    else:
        labels = classes.encode(split.labels, split.origin)
    if split.images is not None:
        preprocess = preprocess or Preprocessor(checkpoint)
        preprocess.check(split.images, split.origin)
        return ImageStream.of(Decoded(split.images, preprocess, split.origin), labels)
    assert split.texts is not None
    encoder = encoder or TextEncoder(checkpoint)
    n, pairs = len(split.texts), split.pairs
    tokens: list[np.ndarray] = []
    types: list[np.ndarray] | None = None if pairs is None else []
    starts = range(0, n, TOKENIZE_CHUNK)
    quiet = n <= TOKENIZE_CHUNK
    for start in tqdm(starts, desc=f"tokenise {split.origin}", leave=False, disable=quiet):
        chunk = slice(start, start + TOKENIZE_CHUNK)
        ids, type_ids = encoder.encode(split.texts[chunk], None if pairs is None else pairs[chunk])
        tokens += ids
        if types is not None and type_ids is not None:
            types += type_ids
    return TokenizedSet(tokens, labels, encoder.pad_id, types)


def pixels(images: Sequence[np.ndarray], checkpoint: Path, origin: str) -> np.ndarray:
    """`[N, C, H, W]` float32 model inputs of `images` (all at once, in memory): the
    checkpoint's image processor (`preprocessor_config.json`), grey images repeated to the
    model's channels."""
    preprocess = Preprocessor(checkpoint)
    preprocess.check(list(images), origin)
    return preprocess(list(images), [f"{origin} image {i}" for i in range(len(images))])
