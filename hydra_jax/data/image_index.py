"""Images on disk as indexes: how many there are, and image i decoded when a batch asks for it.

| source | what opening it reads | image i |
|---|---|---|
| `folder:DIR` | the class folders' file names, each file's size and header | the file |
| `npz:PATH` | `images`' shape and place in the archive; `labels` | its row, from the file |
| `hf:DIR[:SPLIT]` | the saved dataset's table (memory-mapped Arrow); labels | its `image` |
| `tfds:NAME:SPLIT` | the prepared dataset's ArrayRecord files; labels | its `image` |

An `Images` is a sequence of `uint8` `[H, W]` or `[H, W, C]` arrays (a list of arrays is one
too). Reading image i raises `DataError` naming the image where it cannot be decoded. Indexes
carry a `fingerprint` that identifies their content cheaply (file names, sizes and modification
times, not pixels): a pixel cache built from other files is told apart by it.

An `np.savez_compressed` archive cannot be read by rows: its `images` are read whole (raw
`uint8`, before preprocessing), up to `MAX_WHOLE_BYTES`; `np.savez` writes archives that are read
row by row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from hydra_jax.data.dataset import DataError, prefetched

MAX_WHOLE_BYTES = 4 << 30  # the most a compressed `.npz` member may take once decompressed

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@runtime_checkable
class Images(Protocol):
    """`len` images; `images[i]` decodes image i."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...


def name_of(images: Images, i: int) -> str:
    """What names image i in a message: its file where it has one."""
    name = getattr(images, "name", None)
    return name(i) if name is not None else f"image {i}"


def fingerprint_of(images: Images) -> str:
    """An index's `fingerprint`; for images held in memory, a hash of their pixels."""
    known = getattr(images, "fingerprint", None)
    if known is not None:
        return str(known)
    digest = hashlib.sha256()
    for image in images:  # type: ignore[attr-defined]  # in memory: a list of arrays
        array = np.ascontiguousarray(image)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def shapes_of(images: Images) -> list[tuple[int, ...]] | None:
    """Each image's shape where it is known without decoding (None where it is not)."""
    if isinstance(images, list | tuple):
        return [np.shape(image) for image in images]
    shapes = getattr(images, "shapes", None)
    return shapes() if shapes is not None else None


def _hash(lines: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def as_image(image: np.ndarray, origin: str) -> np.ndarray:
    """`image` as `uint8` `[H, W]` or `[H, W, C]` (a trailing single channel dropped).

    Raises:
      DataError: another dtype or rank, named by `origin`.
    """
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise DataError(
            f"{origin}: an image must be uint8 [H, W] or [H, W, C], got "
            f"{image.dtype} {list(image.shape)}"
        )
    return image


def decode(file: Any, origin: str) -> np.ndarray:
    """An encoded image (a path or a binary file) as `uint8` grey `[H, W]` or RGB `[H, W, 3]`.

    Raises:
      DataError: not an image PIL can decode (truncated, corrupt, another format), named.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            image = image.convert("L" if image.mode in ("1", "L", "I;16") else "RGB")
            return np.asarray(image)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise DataError(f"{origin}: not a readable image ({error})") from None


@dataclasses.dataclass(frozen=True, eq=False)
class Subset:
    """The images `rows` of `images`, in that order."""

    images: Images
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.images[int(self.rows[i])]

    def name(self, i: int) -> str:
        return name_of(self.images, int(self.rows[i]))

    @property
    def fingerprint(self) -> str:
        return _hash([fingerprint_of(self.images), hashlib.sha256(self.rows.tobytes()).hexdigest()])

    def shapes(self) -> list[tuple[int, ...]] | None:
        shapes = shapes_of(self.images)
        return None if shapes is None else [shapes[int(r)] for r in self.rows]


# ----------------------------------------------------------------------------- folder:


@dataclasses.dataclass(frozen=True, eq=False)
class FolderImages:
    """The image files of class folders (`files` relative to `root`), decoded on demand."""

    root: Path
    files: tuple[str, ...]
    sizes: np.ndarray  # [N, 2] (height, width), from the files' headers
    fingerprint: str

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> np.ndarray:
        return decode(self.root / self.files[i], self.name(i))

    def name(self, i: int) -> str:
        return str(self.root / self.files[i])

    def shapes(self) -> list[tuple[int, ...]]:
        return [(int(h), int(w)) for h, w in self.sizes]


def open_folder(root: Path, progress: bool = True) -> tuple[FolderImages, list[str]]:
    """The images of `root/CLASS/*.png|jpg|jpeg` and their labels (the class folders' names).

    Every file's header is read (format and size), no file is decoded.

    Raises:
      DataError: no class folders, a class folder without images, a file whose header is not
        an image's (named).
    """
    from PIL import Image, UnidentifiedImageError

    if not root.is_dir():
        raise DataError(f"{root}: an image folder source must be a directory of class folders")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise DataError(f"{root}: no class folders (expected {root}/CLASS/IMAGE.png)")
    files, labels = [], []
    for name in classes:
        found = sorted(
            entry.name
            for entry in os.scandir(root / name)
            if entry.is_file() and Path(entry.name).suffix.lower() in IMAGE_SUFFIXES
        )
        if not found:
            raise DataError(
                f"{root / name}: a class folder with no images ({', '.join(IMAGE_SUFFIXES)})"
            )
        files += [f"{name}/{file}" for file in found]
        labels += [name] * len(found)
    sizes, stats = np.zeros((len(files), 2), np.int64), []
    for i, file in enumerate(tqdm(files, desc=f"index {root}", leave=False, disable=not progress)):
        path = root / file
        try:
            with Image.open(path) as image:  # reads the header only
                sizes[i] = image.size[::-1]
        except (UnidentifiedImageError, OSError) as error:
            raise DataError(f"{path}: not a readable image ({error})") from None
        stat = path.stat()
        stats.append(f"{file}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return FolderImages(root, tuple(files), sizes, _hash(stats)), labels


# ----------------------------------------------------------------------------- npz:


@dataclasses.dataclass(frozen=True, eq=False)
class NpzImages:
    """The `images` array of an `.npz` archive, read row by row from the file (`offset`: the
    first row's byte offset), or held whole where the archive is compressed (`whole`)."""

    path: Path
    shape: tuple[int, ...]  # [N, H, W] or [N, H, W, C]
    offset: int
    whole: np.ndarray | None
    fingerprint: str

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"image {i} of {len(self)}")
        if self.whole is not None:
            return self.whole[i]
        size = math.prod(self.shape[1:])
        with self.path.open("rb") as f:
            f.seek(self.offset + i * size)
            row = f.read(size)
        if len(row) != size:
            raise DataError(f"{self.name(i)}: the file ends inside this image (truncated)")
        return np.frombuffer(row, np.uint8).reshape(self.shape[1:])

    def name(self, i: int) -> str:
        return f"{self.path} image {i}"

    def shapes(self) -> list[tuple[int, ...]]:
        return [self.shape[1:]] * len(self)


def open_npz(path: Path, labelled: bool) -> tuple[NpzImages, list[Any] | None]:
    """The `images` of an `.npz` archive (uint8 `[N, H, W]` or `[N, H, W, C]`) and its `labels`.

    The `images` header must describe exactly the bytes the archive stores for it: a crafted
    header never reads another member's bytes as pixels. A compressed member is read whole, so
    it may hold at most `MAX_WHOLE_BYTES`.

    Raises:
      DataError: not an archive (or a damaged one), no or a wrong `images` array, a header that
        does not match its stored size, a compressed member too large to read whole, `labels`
        of another length, or none where `labelled` (each naming the file).
    """
    try:
        return _open_npz(path, labelled)
    except DataError:
        raise
    except (OSError, ValueError, KeyError, EOFError, struct.error, zipfile.BadZipFile,
            zlib.error, NotImplementedError) as error:  # fmt: skip
        raise DataError(
            f"{path}: not a readable .npz archive ({type(error).__name__}: {error})"
        ) from None


def _open_npz(path: Path, labelled: bool) -> tuple[NpzImages, list[Any] | None]:
    with np.load(path, allow_pickle=False) as archive:
        if "images" not in archive.files:
            raise DataError(f"{path}: no 'images' array (it has {', '.join(archive.files)})")
        info = archive.zip.getinfo("images.npy")
        compressed = info.compress_type != zipfile.ZIP_STORED
        _refuse_large(path, "images", info)
        with archive.zip.open(info) as member:
            shape, fortran, dtype = npy_header(member)
            header = member.tell()
        if dtype != np.uint8 or len(shape) not in (3, 4) or fortran:
            raise DataError(
                f"{path}: 'images' must be uint8 [N, H, W] or [N, H, W, C], got {dtype} "
                f"{list(shape)}"
            )
        if any(d <= 0 for d in shape):
            raise DataError(f"{path}: 'images' has a dimension below 1: {list(shape)}")
        if header + math.prod(shape) != info.file_size:
            raise DataError(
                f"{path}: 'images' says {list(shape)} ({math.prod(shape):,} bytes after its "
                f"{header}-byte header), but the archive stores {info.file_size:,} bytes for it "
                "(a damaged or crafted file)"
            )
        labels = None
        if "labels" in archive.files:
            _refuse_large(path, "labels", archive.zip.getinfo("labels.npy"))
            labels = archive["labels"]
            if labels.shape != shape[:1]:
                raise DataError(
                    f"{path}: 'labels' must be [N] = [{shape[0]}], got {list(labels.shape)}"
                )
            labels = labels.tolist()
        elif labelled:
            raise DataError(f"{path}: no 'labels' array, and this split needs labels")
        whole = archive["images"] if compressed else None
    offset = -1 if whole is not None else _stored_array_offset(path, info)
    if whole is None and offset + math.prod(shape) > path.stat().st_size:
        raise DataError(f"{path}: the file ends inside 'images' (truncated)")
    return NpzImages(path, tuple(shape), offset, whole, files_fingerprint([path])), labels


def _refuse_large(path: Path, name: str, info: zipfile.ZipInfo) -> None:
    """A compressed member is decompressed whole: at most `MAX_WHOLE_BYTES` of it."""
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_WHOLE_BYTES:
        raise DataError(
            f"{path}: '{name}' is compressed ({info.file_size:,} bytes once decompressed, more "
            f"than the {MAX_WHOLE_BYTES:,} read whole at most); save the archive uncompressed "
            "with np.savez (not savez_compressed): its images are then read row by row"
        )


def _stored_array_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """The byte offset of the first element of an uncompressed `.npy` member of a zip file."""
    with path.open("rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # the local file header: its name and extra field lengths at 26..30
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_length + extra_length)
        npy_header(f)
        return f.tell()


def npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """`(shape, fortran_order, dtype)` of the `.npy` data that `f` is at, leaving `f` at its
    first element.

    Raises:
      ValueError: not `.npy` data.
    """
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


# ----------------------------------------------------------------------------- hf:, tfds:


@dataclasses.dataclass(frozen=True, eq=False)
class RecordImages:
    """The `image` feature of a random-access dataset (a saved HF dataset, a prepared TFDS
    dataset's ArrayRecord source): `records[i]` reads record i only; an image it holds encoded
    (PNG or JPEG bytes, as TFDS's `SkipDecoding` leaves it) is decoded here."""

    records: Sequence[Any]
    origin: str
    fingerprint: str
    column: str = "image"

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> np.ndarray:
        try:
            value = self.records[int(i)][self.column]
        except DataError:
            raise
        except Exception as error:  # the library's own kinds: a corrupt or truncated image
            raise DataError(f"{self.name(i)}: not a readable image ({error})") from None
        if isinstance(value, bytes):
            return decode(io.BytesIO(value), self.name(i))
        return as_image(np.asarray(value), self.name(i))

    def name(self, i: int) -> str:
        return f"{self.origin} row {i}"


def files_fingerprint(paths: Iterable[Path]) -> str:
    """A fingerprint of files: their names, sizes and modification times."""
    lines = []
    for path in sorted(paths):
        stat = path.stat()
        lines.append(f"{path.resolve()}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return _hash(lines)


def decodable(
    images: Images, desc: str = "", progress: bool = True, chunk: int = 256
) -> tuple[np.ndarray, list[str]]:
    """The images that decode (their indices, in order) and the names of those that do not:
    a pass that decodes every image once (in threads) and keeps none."""

    def bad_in(start: int) -> list[int]:
        bad = []
        for i in range(start, min(start + chunk, len(images))):
            try:
                images[i]
            except DataError:
                bad.append(i)
        return bad

    unreadable: list[int] = []
    with tqdm(total=len(images), desc=desc, leave=False, disable=not progress) as bar:
        for start, bad in prefetched(bad_in, range(0, len(images), chunk)):
            unreadable += bad
            bar.update(min(chunk, len(images) - start))
    good = np.setdiff1d(np.arange(len(images)), unreadable)
    return good, [name_of(images, i) for i in unreadable]
