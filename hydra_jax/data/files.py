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

`read` gives the raw examples (`RawSplit`); `to_dataset` preprocesses them the way the
checkpoint's own files say (its tokenizer; its `preprocessor_config.json` through `transformers`'
image processor) into a `TokenizedSet` or `ImageSet`. Every problem is reported before any
training, naming the file and what is wrong with it.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax import extras
from hydra_jax.data.dataset import NO_LABEL
from hydra_jax.data.images import ImageSet
from hydra_jax.data.text import TextEncoder, TokenizedSet

TEXT_KINDS = ("csv", "tsv", "jsonl", "parquet")
IMAGE_KINDS = ("folder", "npz")
KINDS = (*TEXT_KINDS, *IMAGE_KINDS, "tfds", "hf")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class DataError(ValueError):
    """Data that cannot be used as given; the message names the file and the problem."""


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
    """Examples as read: `texts` (and `pairs`) or `images` (uint8 `[H, W]` or `[H, W, C]`
    each), and raw `labels` (ints or strings; None where the source has none)."""

    origin: str
    texts: list[str] | None = None
    pairs: list[str] | None = None
    images: list[np.ndarray] | None = None
    labels: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.images or [])

    @property
    def is_images(self) -> bool:
        return self.images is not None


# ----------------------------------------------------------------------------- reading


def read(
    source: Source | str,
    columns: Columns = Columns(),
    data_dir: Path | None = None,
    labelled: bool = True,
) -> RawSplit:
    """The examples of `source`; with `labelled`, its labels are required.

    Raises:
      DataError: a missing file or column, an unreadable image, an empty split, ... (named).
    """
    source = Source.parse(source) if isinstance(source, str) else source
    if source.kind != "tfds" and not Path(source.location).exists():
        raise DataError(f"{source}: {source.location} does not exist")
    if source.kind in TEXT_KINDS:
        split = _read_table(source, columns, labelled)
    elif source.kind == "folder":
        split = _read_folder(Path(source.location))
    elif source.kind == "npz":
        split = _read_npz(Path(source.location), labelled)
    else:
        rows, origin = _read_records(source, data_dir)
        split = _from_records(rows, origin, columns, labelled)
    if len(split) == 0:
        raise DataError(f"{split.origin}: no examples (an empty split)")
    return split


def _read_table(source: Source, columns: Columns, labelled: bool) -> RawSplit:
    path = Path(source.location)
    wanted = [c for c in (columns.text, columns.pair, columns.label) if c]
    if source.kind in ("csv", "tsv"):
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="," if source.kind == "csv" else "\t")
            rows = list(reader)
            header = list(reader.fieldnames or [])
    elif source.kind == "jsonl":
        rows = []
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
                rows.append(row)
        header = sorted({k for row in rows for k in row})
    else:
        pq = extras.studies_import("pyarrow.parquet", "parquet: data files")

        try:
            table = pq.read_table(path)
        except Exception as error:  # pyarrow's own kinds: not a Parquet file, corrupt, ...
            raise DataError(f"{path}: not a readable Parquet table ({error})") from None
        header = table.column_names
        rows = table.select([c for c in wanted if c in header]).to_pylist()
    return _from_records(rows, str(path), columns, labelled, header)


def _from_records(
    rows: Sequence[dict[str, Any]],
    origin: str,
    columns: Columns,
    labelled: bool,
    header: Sequence[str] | None = None,
) -> RawSplit:
    """Rows of a table or dataset as a `RawSplit` (images where rows have an `image`)."""
    header = list(header) if header is not None else sorted({k for r in rows[:1] for k in r})
    if rows and "image" in header and columns.text not in header:
        images = [
            _as_image(np.asarray(r["image"]), f"{origin} row {i}") for i, r in enumerate(rows)
        ]
        labels = _column(rows, columns.label, origin, header) if labelled else None
        return RawSplit(origin, images=images, labels=labels)
    texts = _column(rows, columns.text, origin, header, text=True)
    pairs = _column(rows, columns.pair, origin, header, text=True) if columns.pair else None
    labels = _column(rows, columns.label, origin, header) if labelled else None
    return RawSplit(origin, texts=texts, pairs=pairs, labels=labels)


def _column(
    rows: Sequence[dict[str, Any]], name: str, origin: str, header: Sequence[str], text=False
) -> list[Any]:
    if rows and name not in header:
        raise DataError(f"{origin}: no column {name!r} (its columns: {', '.join(header)})")
    values = []
    for i, row in enumerate(rows):
        value = row.get(name)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"{origin}: row {i + 1} has no {name!r}")
        if text and not isinstance(value, str):
            raise DataError(f"{origin}: row {i + 1}'s {name!r} is not text: {value!r}")
        values.append(value)
    return values


def _read_folder(root: Path) -> RawSplit:
    from PIL import Image, UnidentifiedImageError

    if not root.is_dir():
        raise DataError(f"{root}: an image folder source must be a directory of class folders")
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{root}: no class folders (expected {root}/CLASS/IMAGE.png)")
    images, labels = [], []
    for folder in classes:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataError(
                f"{folder}: a class folder with no images ({', '.join(IMAGE_SUFFIXES)})"
            )
        for file in files:
            try:
                with Image.open(file) as image:
                    image = image.convert("L" if image.mode in ("1", "L", "I;16") else "RGB")
                    images.append(np.asarray(image))
            except (UnidentifiedImageError, OSError) as error:
                raise DataError(f"{file}: not a readable image ({error})") from None
            labels.append(folder.name)
    return RawSplit(str(root), images=images, labels=labels)


def _read_npz(path: Path, labelled: bool) -> RawSplit:
    try:
        arrays = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable .npz file ({error})") from None
    with arrays:
        if "images" not in arrays:
            raise DataError(f"{path}: no 'images' array (it has {', '.join(arrays.files)})")
        images = arrays["images"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise DataError(
                f"{path}: 'images' must be uint8 [N, H, W] or [N, H, W, C], got {images.dtype} "
                f"{list(images.shape)}"
            )
        labels = None
        if "labels" in arrays:
            labels = arrays["labels"]
            if labels.shape != images.shape[:1]:
                raise DataError(
                    f"{path}: 'labels' must be [N] = [{len(images)}], got {list(labels.shape)}"
                )
            labels = labels.tolist()
        elif labelled:
            raise DataError(f"{path}: no 'labels' array, and this split needs labels")
    return RawSplit(str(path), images=list(images), labels=labels)


def _read_records(source: Source, data_dir: Path | None) -> tuple[list[dict[str, Any]], str]:
    """Rows of a prepared TFDS dataset or a saved HF dataset, as dicts."""
    if source.kind == "tfds":
        tfds = extras.studies_import("tensorflow_datasets", "tfds: data sources")
        from hydra_jax.data.sources import default_data_dir

        root = Path(data_dir or default_data_dir()) / "tfds"
        origin = f"tfds:{source.location}:{source.split} in {root}"
        try:
            records = tfds.data_source(
                source.location, split=source.split, data_dir=str(root), download=False
            )
        except Exception as error:  # TFDS raises its own kinds for a missing dataset or split
            raise DataError(f"{origin}: not a prepared TFDS dataset and split ({error})") from None
        return list(records.__getitems__(range(len(records)))), origin
    datasets = extras.studies_import("datasets", "hf: data sources")
    origin = str(source)
    try:
        loaded = datasets.load_from_disk(source.location)
    except FileNotFoundError as error:
        raise DataError(f"{origin}: not a dataset written by save_to_disk ({error})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if source.split not in loaded:
            raise DataError(f"{origin}: no split {source.split!r} (it has {', '.join(loaded)})")
        loaded = loaded[source.split]
    elif source.split:
        raise DataError(f"{origin}: a single dataset has no splits; drop ':{source.split}'")
    return list(loaded.with_format("numpy") if "image" in loaded.column_names else loaded), origin


def _as_image(image: np.ndarray, origin: str) -> np.ndarray:
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise DataError(
            f"{origin}: an image must be uint8 [H, W] or [H, W, C], got "
            f"{image.dtype} {list(image.shape)}"
        )
    return image


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
) -> TokenizedSet | ImageSet:
    """`split` preprocessed as the checkpoint's files say, labelled by `classes` (None: an OOD
    set, every label `NO_LABEL`)."""
    if classes is None or split.labels is None:
        labels = np.full(len(split), NO_LABEL, np.int64)
    else:
        labels = classes.encode(split.labels, split.origin)
    if split.is_images:
        return ImageSet(pixels(split.images, checkpoint, split.origin), labels)
    encoder = encoder or TextEncoder(checkpoint)
    tokens, types = encoder.encode(split.texts, split.pairs)
    return TokenizedSet(tokens, labels, encoder.pad_id, types)


def pixels(images: Sequence[np.ndarray], checkpoint: Path, origin: str) -> np.ndarray:
    """`[N, C, H, W]` float32 model inputs: the checkpoint's image processor
    (`preprocessor_config.json`), with grey images repeated to the model's channels."""
    import transformers

    checkpoint = Path(checkpoint)
    if not (checkpoint / "preprocessor_config.json").is_file():
        raise DataError(
            f"{checkpoint} has no preprocessor_config.json: images need the image "
            "processor the checkpoint was trained with"
        )
    channels = _num_channels(checkpoint)
    processor = transformers.AutoImageProcessor.from_pretrained(checkpoint, local_files_only=True)
    shaped = []
    for i, image in enumerate(images):
        if image.ndim == 2:
            image = image[..., None]
        if image.shape[-1] != channels:
            if image.shape[-1] != 1:
                raise DataError(
                    f"{origin}: image {i} has {image.shape[-1]} channels; the model "
                    f"takes {channels}"
                )
            image = np.repeat(image, channels, axis=-1)
        shaped.append(image)
    if len({im.shape for im in shaped}) > 1 and not getattr(processor, "do_resize", False):
        sizes = sorted({im.shape[:2] for im in shaped})
        raise DataError(
            f"{origin}: images of several sizes {sizes[:3]}... and the image "
            f"processor of {checkpoint} does not resize"
        )
    out = processor(shaped, return_tensors="np", input_data_format="channels_last")
    return np.asarray(out["pixel_values"], np.float32)


def _num_channels(checkpoint: Path) -> int:
    config = json.loads((checkpoint / "config.json").read_text())
    vision = config.get("vision_config", config)
    return int(vision.get("num_channels", 3))
