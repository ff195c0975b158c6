"""Reads PyTorch `.bin` state dicts without torch and without executing pickle code.

A `torch.save` zip archive holds `ARCHIVE/data.pkl` (a pickle that names rebuild functions and
storage classes) and `ARCHIVE/data/KEY` (raw little-endian storage bytes). The unpickler below
resolves only an allow-list of globals to our own numpy implementations; any other global (the
way malicious pickles run code) is refused before anything is called.
"""

from __future__ import annotations

import collections
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


def _rebuild_tensor_v2(
    storage: np.ndarray,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> np.ndarray:
    del requires_grad, backward_hooks, metadata
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[storage_offset:], shape=tuple(size), strides=tuple(s * item for s in stride)
    )
    return np.array(view)  # a contiguous copy that no longer aliases the storage


def _rebuild_parameter(data: np.ndarray, requires_grad: bool, backward_hooks: Any) -> np.ndarray:
    del requires_grad, backward_hooks
    return data


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

    def persistent_load(self, pid: Any) -> np.ndarray:
        kind, storage_type, key, _location, numel = pid
        if kind != "storage" or storage_type not in _STORAGE_DTYPES:
            raise UnsafePickleError(f"unsupported persistent id in checkpoint: {pid!r}")
        raw = self._archive.read(f"{self._root}/data/{key}")
        dtype = np.dtype(_STORAGE_DTYPES[storage_type])
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<"), count=numel)


def load_torch_bin(path: str | Path) -> dict[str, np.ndarray]:
    """Loads a `torch.save`d state dict as numpy arrays.

    Raises:
      UnsafePickleError: the pickle names a global outside the allow-list.
      ValueError: the file is not a zip-format torch checkpoint.
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
            state = _Unpickler(f, archive, root).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
    return dict(state)
