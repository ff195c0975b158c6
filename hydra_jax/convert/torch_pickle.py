"""Reads PyTorch `.bin` state dicts without torch and without executing pickle code.

A `torch.save` zip archive holds `ARCHIVE/data.pkl` (a pickle that names rebuild functions and
storage classes) and `ARCHIVE/data/KEY` (raw little-endian storage bytes). The unpickler below
resolves only an allow-list of globals to our own numpy implementations; any other global (the
way malicious pickles run code) is refused before anything is called.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import pickle
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np


class UnsafePickleError(ValueError):
    """A pickle names a global outside the allow-list."""


_STORAGE_DTYPES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


@dataclasses.dataclass(frozen=True)
class _Storage:
    """A storage as the pickle declares it; its bytes are read and checked when a tensor uses it."""

    key: str
    dtype: np.dtype
    numel: Any  # declared element count (validated before use: the pickle is untrusted)


@dataclasses.dataclass(frozen=True)
class _TensorRef:
    """`_rebuild_tensor_v2`'s arguments, kept unevaluated until the tensor's name is known."""

    storage: Any
    offset: Any
    size: Any
    stride: Any


def _rebuild_tensor_v2(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> _TensorRef:
    del requires_grad, backward_hooks, metadata
    return _TensorRef(storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any) -> Any:
    del requires_grad, backward_hooks
    return data


def _is_index(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _materialise(ref: _TensorRef, archive: zipfile.ZipFile, root: str, where: str) -> np.ndarray:
    """The tensor `ref` describes, as a fresh array, after checking it stays inside its storage.

    A pickle made only of allowed globals can still declare any size, stride and offset; read
    blindly with `as_strided` they address memory outside the storage (a crash, or process
    memory copied into a "weight").

    Raises:
      ValueError: naming `where` (file and tensor) and the offending geometry.
    """
    storage = ref.storage
    if not isinstance(storage, _Storage):
        raise ValueError(f"{where}: its storage is a {type(storage).__name__}, not a storage")
    size, stride, offset = ref.size, ref.stride, ref.offset
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)):
        raise ValueError(f"{where}: size {size!r} and stride {stride!r} are not tuples of one rank")
    if not all(_is_index(x) for x in (*size, *stride, offset, storage.numel)):
        raise ValueError(
            f"{where}: size {size}, stride {stride}, storage offset {offset} and storage length "
            f"{storage.numel} must be non-negative integers"
        )
    count = math.prod(size)
    if math.prod(n for n in size if n) * storage.dtype.itemsize >= 2**62:
        raise ValueError(f"{where}: size {size} is too large for any array")
    reach = sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    extent = 0 if count == 0 else offset + reach + 1
    if extent > storage.numel:
        raise ValueError(
            f"{where}: size {size}, stride {stride} and offset {offset} reach element "
            f"{extent - 1}, past the end of its storage of {storage.numel} elements"
        )
    if count > storage.numel:
        raise ValueError(
            f"{where}: {count} elements from a storage of {storage.numel} (overlapping strides, "
            "e.g. an expanded tensor) are not supported; save a contiguous copy"
        )
    name = f"{root}/data/{storage.key}"
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise ValueError(f"{where}: its storage {name} is missing from the archive") from None
    expected = storage.numel * storage.dtype.itemsize
    if info.file_size != expected:
        raise ValueError(
            f"{where}: storage {name} holds {info.file_size} bytes, but the pickle declares "
            f"{storage.numel} x {storage.dtype} = {expected} bytes"
        )
    data = np.frombuffer(archive.read(name), dtype=storage.dtype, count=storage.numel)
    if count == 0:
        return np.zeros(size, storage.dtype)
    # A stride along an axis of length 1 is never used, and may be any (huge) number.
    item = storage.dtype.itemsize
    strides = tuple(s * item if n > 1 else 0 for n, s in zip(size, stride, strict=True))
    view = np.lib.stride_tricks.as_strided(
        data[offset:], shape=size, strides=strides, writeable=False
    )
    return np.array(view)  # a contiguous copy that no longer aliases the storage


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): name for name in _STORAGE_DTYPES},
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, archive: zipfile.ZipFile, root: str):
        super().__init__(file)
        self._archive = archive
        self._root = root

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load pickle global {module}.{name}: only tensors and state dicts "
                f"are allowed in a checkpoint (allowed: "
                f"{sorted(f'{m}.{n}' for m, n in _ALLOWED)})"
            ) from None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5):
            raise UnsafePickleError(f"unsupported persistent id in checkpoint: {pid!r}")
        kind, storage_type, key, _location, numel = pid
        if kind != "storage" or storage_type not in _STORAGE_DTYPES or not isinstance(key, str):
            raise UnsafePickleError(f"unsupported persistent id in checkpoint: {pid!r}")
        dtype = np.dtype(_STORAGE_DTYPES[storage_type]).newbyteorder("<")
        return _Storage(key, dtype, numel)


def load_torch_bin(path: str | Path) -> dict[str, np.ndarray]:
    """Loads a `torch.save`d state dict as numpy arrays.

    Raises:
      UnsafePickleError: the pickle names a global outside the allow-list.
      ValueError: the file is not a zip-format torch checkpoint, is truncated, or describes a
        tensor that does not fit its storage (file and tensor named).
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a zip-format torch checkpoint (the legacy pre-1.6 format is not "
            "supported); re-save it with a current torch or convert it to safetensors"
        )
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one data.pkl in the archive, found {pickles}")
        root = pickles[0][: -len("/data.pkl")]
        byteorder = f"{root}/byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise ValueError(f"{path}: big-endian checkpoints are not supported")
        with archive.open(pickles[0]) as f:
            try:
                state = _Unpickler(f, archive, root).load()
            except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as error:
                if isinstance(error, UnsafePickleError):
                    raise
                raise ValueError(f"{path}: malformed data.pkl ({error})") from None
        if not isinstance(state, dict):
            raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
        tensors = {}
        for name, ref in state.items():
            if not isinstance(name, str) or not isinstance(ref, _TensorRef):
                raise ValueError(f"{path}: entry {name!r} is not a named tensor")
            tensors[name] = _materialise(ref, archive, root, f"{path}, tensor {name!r}")
    return tensors
