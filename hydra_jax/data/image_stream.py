"""`ImageStream`: an image `Dataset` that decodes and preprocesses the images of each batch when
the batch is asked for, so memory holds batches, never a whole set of model inputs.

A stream is a list of *parts* and, per example, the part and row it is read from (so `take` and
`concat` copy no pixels). A part gives the model inputs `[n, C, H, W]` of some of its rows:

- `Decoded`: images from an index (`hydra_jax.data.image_index`), decoded and run through the
  checkpoint's image processor (`Preprocessor`) batch by batch;
- `PixelFile`: rows of preprocessed inputs written once to a `.npy` file
  (`hydra_jax.data.pixel_cache`), read back without decoding.

Training asks for batches in Grain's background threads (`hydra_jax.data.loader`), prediction
in a thread pool (`prefetched`), so decoding overlaps the model's steps.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hydra_jax.data.dataset import Batch, DataError
from hydra_jax.data.image_index import Images, fingerprint_of, name_of, shapes_of


class Preprocessor:
    """The checkpoint's image processor (`preprocessor_config.json`, through `transformers`):
    `uint8` images -> `[n, C, H, W]` float32, grey images repeated to the model's channels.

    Each image is processed on its own (as the processor does within a list), so a batch gives
    the same values as the whole set at once. `key` identifies the processing (its config, the
    model's channels, the `transformers` version) for the pixel cache.
    """

    def __init__(self, checkpoint: Path):
        import transformers

        checkpoint = Path(checkpoint)
        config_file = checkpoint / "preprocessor_config.json"
        if not config_file.is_file():
            raise DataError(
                f"{checkpoint} has no preprocessor_config.json: images need the image "
                "processor the checkpoint was trained with"
            )
        self.checkpoint = checkpoint
        self.channels = _num_channels(checkpoint)
        self.processor = transformers.AutoImageProcessor.from_pretrained(
            checkpoint, local_files_only=True
        )
        self.resizes = bool(getattr(self.processor, "do_resize", False))
        settings = json.loads(config_file.read_text())
        self.key = hashlib.sha256(
            json.dumps(
                [settings, self.channels, type(self.processor).__name__, transformers.__version__],
                sort_keys=True,
            ).encode()
        ).hexdigest()

    def check(self, images: Images, origin: str) -> None:
        """Refuses what can be told before decoding: images of several sizes where the processor
        does not resize, images whose channels are neither 1 nor the model's (where known).

        Raises:
          DataError: named by `origin` and the image.
        """
        shapes = shapes_of(images)
        if shapes is None:
            return
        for i, shape in enumerate(shapes):
            if len(shape) == 3 and shape[-1] not in (1, self.channels):
                raise DataError(
                    f"{origin}: image {i} has {shape[-1]} channels; the model takes {self.channels}"
                )
        sizes = {tuple(shape[:2]) for shape in shapes}
        if len(sizes) > 1 and not self.resizes:
            raise DataError(
                f"{origin}: images of several sizes {sorted(sizes)[:3]}... and the image "
                f"processor of {self.checkpoint} does not resize"
            )

    def __call__(self, images: Iterable[np.ndarray], names: Sequence[str]) -> np.ndarray:
        """`[n, C, H, W]` float32 model inputs of the `n` `images` (named by `names` in errors;
        an iterator of images is decoded one at a time).

        Raises:
          DataError: an image with other channels, or of another size where the processor does
            not resize.
        """
        out = None
        for j, (image, name) in enumerate(zip(images, names, strict=True)):
            if image.ndim == 2:
                image = image[..., None]
            if image.shape[-1] != self.channels:
                if image.shape[-1] != 1:
                    raise DataError(
                        f"{name} has {image.shape[-1]} channels; the model takes {self.channels}"
                    )
                image = np.repeat(image, self.channels, axis=-1)
            # One image at a time: the processor's float intermediates stay one image's.
            pixels = self.processor(
                [image], return_tensors="np", input_data_format="channels_last"
            )["pixel_values"][0]
            if out is None:
                out = np.empty((len(names), *pixels.shape), np.float32)
            elif pixels.shape != out.shape[1:]:
                raise DataError(
                    f"{name}: model inputs of shape {pixels.shape}, the batch's first "
                    f"{out.shape[1:]}: images of several sizes, and the image processor of "
                    f"{self.checkpoint} does not resize"
                )
            out[j] = pixels
        assert out is not None
        return out


def _num_channels(checkpoint: Path) -> int:
    config = json.loads((checkpoint / "config.json").read_text())
    vision = config.get("vision_config", config)
    return int(vision.get("num_channels", 3))


class Part(Protocol):
    """Rows of model inputs: `pixels(rows)` is `[len(rows), C, H, W]` float32."""

    origin: str

    def __len__(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    def pixels(self, rows: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Decoded:
    """Images of an index, decoded and preprocessed when their rows are asked for."""

    images: Images
    preprocess: Preprocessor
    origin: str

    def __len__(self) -> int:
        return len(self.images)

    @functools.cached_property
    def fingerprint(self) -> str:
        return hashlib.sha256(
            f"{fingerprint_of(self.images)}\n{self.preprocess.key}".encode()
        ).hexdigest()

    def pixels(self, rows: np.ndarray) -> np.ndarray:
        images = (self.images[int(r)] for r in rows)  # each decoded when processed
        return self.preprocess(images, [name_of(self.images, int(r)) for r in rows])


@dataclasses.dataclass(frozen=True, eq=False)
class PixelFile:
    """Preprocessed model inputs `[N, C, H, W]` float32 in a `.npy` file, read row by row (no
    memory map: rows read once are not kept by the process)."""

    path: Path
    shape: tuple[int, ...]
    offset: int  # the first row's byte offset
    fingerprint: str

    @property
    def origin(self) -> str:
        return str(self.path)

    def __len__(self) -> int:
        return self.shape[0]

    def pixels(self, rows: np.ndarray) -> np.ndarray:
        size = 4 * int(np.prod(self.shape[1:]))
        out = np.empty((len(rows), *self.shape[1:]), np.float32)
        with self.path.open("rb") as f:
            for j, r in enumerate(rows):
                f.seek(self.offset + int(r) * size)
                raw = f.read(size)
                if len(raw) != size:
                    raise DataError(f"{self.path}: the pixel cache ends inside row {r}")
                out[j] = np.frombuffer(raw, "<f4").reshape(self.shape[1:])
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class ImageStream:
    """Examples read from `parts`: example i is row `rows[i, 1]` of part `rows[i, 0]`, with
    label `labels[i]`. Every example has the same size, so batches need no padding; a short
    batch is filled by repeating its first example (read once)."""

    parts: tuple[Part, ...]
    rows: np.ndarray  # [N, 2] int64: (part, row)
    labels: np.ndarray  # [N]

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or self.rows.shape[1] != 2 or len(self.rows) != len(self.labels):
            raise ValueError(
                f"rows must be [N, 2] with one label each; got rows {self.rows.shape} and "
                f"labels {self.labels.shape}"
            )

    @classmethod
    def of(cls, part: Part, labels: np.ndarray) -> ImageStream:
        """Every row of `part`, in order."""
        n = len(part)
        rows = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], axis=1)
        return cls((part,), rows, np.asarray(labels))

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        return np.ones(len(self), np.int64)  # one size: batching keeps the given order

    def take(self, index: np.ndarray) -> ImageStream:
        index = np.asarray(index, np.int64)
        return ImageStream(self.parts, self.rows[index], self.labels[index])

    def concat(self, other: Any) -> ImageStream:
        if not isinstance(other, ImageStream):
            raise TypeError("an image stream concatenates only with another image stream")
        shifted = other.rows + np.array([len(self.parts), 0])
        return ImageStream(
            self.parts + other.parts,
            np.concatenate([self.rows, shifted]),
            np.concatenate([self.labels, other.labels]),
        )

    def batch(self, index: np.ndarray, batch_size: int | None = None, length: int = 0) -> Batch:
        del length  # every image has the same size
        index = np.asarray(index, np.int64)
        if index.size == 0:
            raise ValueError("empty batch: no images")
        if batch_size is not None:
            index = np.r_[index, np.repeat(index[:1], batch_size - len(index))]
        labels = self.labels[index]
        unique, inverse = np.unique(index, return_inverse=True)
        if len(unique) == len(index):  # read in the batch's order: the part's array, no copy
            return {"pixel_values": self._pixels(self.rows[index]), "labels": labels}
        # A filled batch repeats its first example: each example read once.
        return {"pixel_values": self._pixels(self.rows[unique])[inverse.ravel()], "labels": labels}

    def _pixels(self, rows: np.ndarray) -> np.ndarray:
        """Model inputs of `rows` (`[n, 2]`: part, row), in that order; one part's are its own
        array (no copy)."""
        parts = np.unique(rows[:, 0])
        if len(parts) == 1:
            return self.parts[parts[0]].pixels(rows[:, 1])
        pixels = None
        for part in parts:
            chosen = np.nonzero(rows[:, 0] == part)[0]
            values = self.parts[part].pixels(rows[chosen, 1])
            if pixels is None:
                pixels = np.empty((len(rows), *values.shape[1:]), np.float32)
            elif values.shape[1:] != pixels.shape[1:]:
                raise DataError(
                    f"{self.parts[part].origin}: model inputs of shape {values.shape[1:]}, "
                    f"others of the same set {pixels.shape[1:]}"
                )
            pixels[chosen] = values
        assert pixels is not None
        return pixels
