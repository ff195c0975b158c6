"""A cache of preprocessed images (`data.cache=DIR`): each image set's model inputs are written
once to `DIR/KEY.npy` (float32 `[N, C, H, W]`, a plain `.npy` file), and later epochs, members,
stages and runs read rows from it instead of decoding the images again.

KEY hashes what the inputs depend on: each source's fingerprint (its files' names, sizes and
modification times), the image processor's settings, the model's channels, the `transformers`
version, and which rows the set holds. A set whose files or processor changed has another key,
so it is written anew, never read stale; the file the same set wrote before (`DIR/index.json`
names it by the set's source) is removed, and the log says why. A file cut short (a killed run)
is written again. Only the first process writes; the others wait for it and read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from hydra_jax.data.dataset import prefetched
from hydra_jax.data.image_index import npy_header
from hydra_jax.data.image_stream import ImageStream, PixelFile
from hydra_jax.models.sharding import barrier, is_primary

logger = logging.getLogger(__name__)
FORMAT = 1  # the cache's layout: a change writes every set anew


def key_of(stream: ImageStream) -> str:
    """What `stream`'s model inputs depend on, hashed."""
    described = {
        "format": FORMAT,
        "parts": [part.fingerprint for part in stream.parts],
        "rows": hashlib.sha256(np.ascontiguousarray(stream.rows).tobytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:32]


def cached(
    stream: ImageStream, directory: Path, name: str, progress: bool = True, batch_size: int = 64
) -> ImageStream:
    """`stream` read from its file in `directory`, written first where there is none (`name`,
    the set's source, says in `index.json` which file it wrote)."""
    directory = Path(directory)
    key = key_of(stream)
    path = directory / f"{key}.npy"
    if open_pixel_file(path, key) is None and is_primary():
        directory.mkdir(parents=True, exist_ok=True)
        _forget_stale(directory, name, key)
        write(stream, path, f"cache {name}", progress, batch_size)
    barrier(f"pixel cache {key}")
    pixel_file = open_pixel_file(path, key)
    if pixel_file is None or len(pixel_file) != len(stream):
        raise RuntimeError(f"{path}: the pixel cache of {name} was not written whole")
    return ImageStream.of(pixel_file, stream.labels)


def _forget_stale(directory: Path, name: str, key: str) -> None:
    index_file = directory / "index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    before = index.get(name)
    if before and before != key:
        stale = directory / f"{before}.npy"
        if stale.is_file():
            logger.warning(
                "pixel cache: %s changed (files or image processor) since %s was written; "
                "writing %s.npy instead",
                name,
                stale,
                key,
            )
            stale.unlink()
    index[name] = key
    tmp = index_file.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(index, indent=2, sort_keys=True))
    os.replace(tmp, index_file)


def write(
    stream: ImageStream, path: Path, desc: str, progress: bool = True, batch_size: int = 64
) -> None:
    """Every example's model inputs, in order, to the `.npy` file `path` (written under
    another name, then renamed: a file at `path` is always whole)."""
    n = len(stream)
    starts = range(0, n, batch_size)
    tmp = path.with_suffix(f".tmp{os.getpid()}")

    def inputs(start: int) -> np.ndarray:
        return stream.batch(np.arange(start, min(start + batch_size, n)))["pixel_values"]

    with tmp.open("wb") as f, tqdm(total=n, desc=desc, leave=False, disable=not progress) as bar:
        for start, pixels in prefetched(inputs, starts):
            if start == 0:
                header = {"descr": "<f4", "fortran_order": False, "shape": (n, *pixels.shape[1:])}
                np.lib.format.write_array_header_2_0(f, header)
            f.write(np.ascontiguousarray(pixels, "<f4").tobytes())
            bar.update(len(pixels))
    os.replace(tmp, path)


def open_pixel_file(path: Path, fingerprint: str) -> PixelFile | None:
    """The `.npy` file `path` as a `PixelFile`; None where it is missing or cut short."""
    if not path.is_file():
        return None
    with path.open("rb") as f:
        try:
            shape, fortran, dtype = npy_header(f)
        except ValueError:
            return None
        offset = f.tell()
    whole = offset + 4 * int(np.prod(shape))
    if dtype != np.dtype("<f4") or fortran or len(shape) != 4 or path.stat().st_size != whole:
        return None
    return PixelFile(path, tuple(shape), offset, fingerprint)
