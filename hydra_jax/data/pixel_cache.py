"""A cache of preprocessed images (`data.cache=DIR`): each image set's model inputs are written
once to `DIR/KEY.npy` (float32 `[N, C, H, W]`, a `.npy` file that `np.load` reads), and later
epochs, members, stages and runs read rows from it instead of decoding the images again.

KEY hashes everything that decides the file's bytes: each source's fingerprint (its files'
names, sizes and modification times, and the checkpoint's image processor: its settings, class
and channels, with the `transformers` version), which rows the set holds, the Pillow and NumPy
versions, and `DECODING`, the version of our own decoding. A set whose files, processor or
libraries changed has another key, so it is written anew, never read stale.

The directory may be shared by runs on one host or several (a network file system):

- An entry is never deleted while another run may read it: a changed set gets a new entry
  beside the old one; an entry is removed only once unused for `keep_days` (each run that opens
  it marks it used), and a temporary file once untouched for `TEMP_DAYS`.
- A writer writes a temporary file of a unique name (`mkstemp`), ends it with a trailer holding
  the key and the row count, flushes it to disk (`fsync`) and renames it into place: a file at
  `KEY.npy` is always whole, and one cut short or of another key is never read.
- Runs that build the same entry at once each write their own file; the first to finish
  publishes it, and the others read that one (the bytes are the same).

Inside one `jax.distributed` job only process 0 writes; the others wait for it and read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import PIL
from tqdm.auto import tqdm

from hydra_jax.data.dataset import prefetched
from hydra_jax.data.image_index import npy_header
from hydra_jax.data.image_stream import ImageStream, PixelFile
from hydra_jax.models.sharding import barrier, is_primary

logger = logging.getLogger(__name__)
FORMAT = 2  # the cache's layout: a change writes every set anew
DECODING = 1  # our decoding and preprocessing (image_index.decode, Preprocessor): bump on change
MAGIC = b"HYDRAJAX-PIXELS"  # the trailer: MAGIC, the key (32 hex digits), the row count (8 bytes)
TRAILER = len(MAGIC) + 32 + 8
TEMP_DAYS = 1.0  # a temporary file untouched this long belongs to a writer that is gone
KEEP_DAYS = 30.0  # an entry unused this long is removed


def key_of(stream: ImageStream) -> str:
    """What `stream`'s model inputs depend on, hashed (32 hex digits)."""
    described = {
        "format": FORMAT,
        "decoding": DECODING,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "parts": [part.fingerprint for part in stream.parts],
        "rows": hashlib.sha256(np.ascontiguousarray(stream.rows).tobytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:32]


def cached(
    stream: ImageStream,
    directory: Path,
    name: str,
    progress: bool = True,
    batch_size: int = 64,
    keep_days: float = KEEP_DAYS,
) -> ImageStream:
    """`stream` read from its entry in `directory`, written first where there is none (`name`,
    the set's source, for the log and errors)."""
    directory = Path(directory)
    key = key_of(stream)
    path = directory / f"{key}.npy"
    if open_pixel_file(path, key) is None and is_primary():
        directory.mkdir(parents=True, exist_ok=True)
        clean(directory, keep_days)
        logger.info("pixel cache: writing %s for %s", path, name)
        write(stream, path, key, f"cache {name}", progress, batch_size)
    barrier(f"pixel cache {key}")
    pixel_file = open_pixel_file(path, key)
    if pixel_file is None or len(pixel_file) != len(stream):
        raise RuntimeError(f"{path}: the pixel cache of {name} was not written whole")
    with contextlib.suppress(OSError):  # used now: not removed for `keep_days`
        os.utime(path)
    return ImageStream.of(pixel_file, stream.labels)


def clean(directory: Path, keep_days: float = KEEP_DAYS) -> None:
    """Removes the temporary files untouched for `TEMP_DAYS` and the entries unused for
    `keep_days`. Another run's removal of the same file is no error."""
    now = time.time()
    for pattern, days in ((".*.tmp", TEMP_DAYS), ("*.npy", keep_days)):
        for path in directory.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > days * 86400:
                    logger.info("pixel cache: removing %s (unused for %.0f days)", path, days)
                    path.unlink()


def write(
    stream: ImageStream,
    path: Path,
    key: str,
    desc: str = "cache",
    progress: bool = True,
    batch_size: int = 64,
) -> None:
    """Every example's model inputs, in order, to the entry `path` of `key`: written to a
    temporary file of its own, ended by the trailer, flushed to disk and renamed to `path`
    unless another writer published it first."""
    n = len(stream)
    starts = range(0, n, batch_size)

    def inputs(start: int) -> np.ndarray:
        return stream.batch(np.arange(start, min(start + batch_size, n)))["pixel_values"]

    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with (
            os.fdopen(fd, "wb") as f,
            tqdm(total=n, desc=desc, leave=False, disable=not progress) as bar,
        ):
            for start, pixels in prefetched(inputs, starts):
                if start == 0:
                    shape = (n, *pixels.shape[1:])
                    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
                    np.lib.format.write_array_header_2_0(f, header)
                f.write(np.ascontiguousarray(pixels, "<f4").tobytes())
                bar.update(len(pixels))
            f.write(MAGIC + key.encode() + n.to_bytes(8, "little"))
            f.flush()
            os.fsync(f.fileno())
        if open_pixel_file(path, key) is None:
            os.replace(tmp, path)
            _sync_directory(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _sync_directory(directory: Path) -> None:
    """The rename into `directory` made durable (where the file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_pixel_file(path: Path, key: str) -> PixelFile | None:
    """The entry `path` of `key` as a `PixelFile`; None where it is missing, cut short, not
    float32 `[N, C, H, W]` or ended by another key's trailer."""
    try:
        with path.open("rb") as f:
            shape, fortran, dtype = npy_header(f)
            offset = f.tell()
            if dtype != np.dtype("<f4") or fortran or len(shape) != 4 or min(shape) < 1:
                return None
            end = offset + 4 * math.prod(shape)
            if path.stat().st_size != end + TRAILER:
                return None
            f.seek(end)
            trailer = f.read(TRAILER)
    except (OSError, ValueError):
        return None
    if trailer != MAGIC + key.encode() + shape[0].to_bytes(8, "little"):
        return None
    return PixelFile(path, tuple(shape), offset, key)
