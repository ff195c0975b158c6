"""Checkpoints refused before any weight is used: directories, config fields, tensors, `.bin`
pickles."""

from __future__ import annotations

import re
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax.convert.torch_pickle import load_torch_bin

POOLER = "bert.pooler.dense.weight"
RAW = np.arange(7, dtype=np.float32).tobytes()  # a float32 storage of 7 elements


def with_(**fields):
    return lambda hf: {**hf, **fields}


def without(key):
    return lambda hf: {k: v for k, v in hf.items() if k != key}


def tensor_edit(name, edit):
    return lambda weights: {**weights, name: edit(weights[name])}


def drop_tensor(name):
    return lambda weights: {k: v for k, v in weights.items() if k != name}


def torch_pickle(offset, size, stride, numel) -> bytes:
    """A `torch.save` data.pkl of one float tensor `t` with this geometry over its storage."""

    def integer(i: int) -> bytes:
        raw = i.to_bytes(max(1, (i.bit_length() + 8) // 8), "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw

    def text(s: str) -> bytes:
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def tup(values) -> bytes:
        return b"(" + b"".join(integer(v) for v in values) + b"t"

    pid = b"(" + text("storage") + b"ctorch\nFloatStorage\n" + text("0") + text("cpu")
    pid += integer(numel) + b"tQ"
    args = b"(" + pid + integer(offset) + tup(size) + tup(stride) + b"\x89N" + b"t"
    return b"\x80\x02}" + text("t") + b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"Rs."


def write_bin(path: Path, pickled: bytes, storage: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x/data.pkl", pickled)
        archive.writestr("x/data/0", storage)
    return path


def truncated(path: Path):
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    return hj.from_pretrained(path)


def exploit(c):
    """A `.bin` whose pickle would run `touch pwned`; loading it must refuse before it runs."""
    import pickle

    class Exploit:
        def __reduce__(self):
            import os

            return (os.system, ("touch pwned",))

    path = c.tmp / "exploit"
    path.mkdir(exist_ok=True)
    shutil.copy(c.saved_bert / "config.json", path)
    with zipfile.ZipFile(path / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"w": Exploit()}))
    try:
        return hj.from_pretrained(path)
    finally:
        assert not Path("pwned").exists(), "the exploit pickle ran code"


CASES = [
    pytest.param(
        lambda c: hj.from_pretrained("org/model"),
        hj.ConversionError,
        "never downloads",
        id="not a directory",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c1", remove="config.json")),
        hj.ConversionError,
        "no config.json",
        id="no config.json",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c2", remove="model.safetensors")),
        hj.ConversionError,
        "neither model.safetensors",
        id="no weights file",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c3", config=lambda h: "{oops")),
        hj.ConversionError,
        "not valid JSON",
        id="invalid JSON",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c4", config=lambda h: [1])),
        hj.ConversionError,
        "not an object",
        id="config is a list",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c5", with_(model_type="gpt9"))),
        hj.ConversionError,
        "unknown model_type",
        id="unknown model_type",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c6", with_(rotary=1))),
        hj.ConversionError,
        "unhandled BERT config field",
        id="unknown field",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c7", without("hidden_size"))),
        hj.ConversionError,
        "required field 'hidden_size'",
        id="missing hidden_size",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c8", with_(hidden_size="16"))),
        hj.ConversionError,
        "'hidden_size' is '16'",
        id="hidden_size a string",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c9", with_(num_hidden_layers=2.0))),
        hj.ConversionError,
        "'num_hidden_layers' is 2.0",
        id="layers a float",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c10", with_(layer_norm_eps=True))),
        hj.ConversionError,
        "'layer_norm_eps' is True",
        id="eps a bool",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c11", with_(num_attention_heads=3))),
        hj.ConversionError,
        "not divisible",
        id="heads do not divide width",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c12", with_(num_hidden_layers=0))),
        hj.ConversionError,
        "sizes must be positive",
        id="zero layers",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c13", with_(hidden_act="mish"))),
        hj.ConversionError,
        "hidden_act='mish' unsupported",
        id="unknown activation",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("c14", with_(is_decoder=True))),
        hj.ConversionError,
        "is_decoder=True",
        id="decoder config",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(
            c.edited("c15", with_(position_embedding_type="relative_key"))
        ),
        hj.ConversionError,
        "only 'absolute'",
        id="relative positions",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("t1", tensors=drop_tensor(POOLER))),
        hj.ConversionError,
        "missing tensor 'pooler.dense.weight'",
        id="missing tensor",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(
            c.edited("t9", tensors=drop_tensor("bert.encoder.layer.1.attention.self.key.bias"))
        ),
        hj.ConversionError,
        "missing tensor 'encoder.layer.1.attention.self.key.bias'",
        id="missing attention tensor",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("t2", tensors=lambda t: {**t, "x.y": np.ones(2)})),
        hj.ConversionError,
        "does not use",
        id="extra tensor",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(
            c.edited("t3", tensors=tensor_edit(POOLER, lambda x: x[:, :3]))
        ),
        hj.ConversionError,
        "has shape (16, 3)",
        id="mis-shaped tensor",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(
            c.edited("t4", tensors=tensor_edit(POOLER, lambda x: x.astype(np.int8)))
        ),
        hj.ConversionError,
        "dtype int8",
        id="int8 weights",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(c.edited("t5", tensors=tensor_edit(POOLER, lambda x: x > 0))),
        hj.ConversionError,
        "dtype bool",
        id="bool weights",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(
            c.edited("t6", tensors=tensor_edit(POOLER, lambda x: x * np.nan))
        ),
        hj.ConversionError,
        "NaN/inf",
        id="NaN weight",
    ),
    pytest.param(
        lambda c: hj.from_pretrained(
            c.edited("t7", tensors=tensor_edit(POOLER, lambda x: x + np.inf))
        ),
        hj.ConversionError,
        "NaN/inf",
        id="inf weight",
    ),
    pytest.param(
        lambda c: truncated(c.edited("t8")),
        hj.ConversionError,
        "truncated or corrupt",
        id="truncated safetensors",
    ),
    pytest.param(
        lambda c: exploit(c),
        hj.convert.UnsafePickleError,
        "refusing to load pickle global",
        id="pickle running os.system",
    ),
    pytest.param(
        lambda c: load_torch_bin(
            write_bin(c.tmp / "p1.bin", torch_pickle(2, (3, 3), (3, 1), 7), RAW)
        ),
        ValueError,
        "past the end",
        id="tensor past its storage",
    ),
    pytest.param(
        lambda c: load_torch_bin(
            write_bin(c.tmp / "p2.bin", torch_pickle(0, (2, 2), (2**40, 1), 7), RAW)
        ),
        ValueError,
        "past the end",
        id="huge stride",
    ),
    pytest.param(
        lambda c: load_torch_bin(write_bin(c.tmp / "p3.bin", torch_pickle(0, (2,), (-1,), 7), RAW)),
        ValueError,
        "non-negative",
        id="negative stride",
    ),
    pytest.param(
        lambda c: load_torch_bin(write_bin(c.tmp / "p4.bin", torch_pickle(-3, (2,), (1,), 7), RAW)),
        ValueError,
        "non-negative",
        id="negative offset",
    ),
    pytest.param(
        lambda c: load_torch_bin(
            write_bin(c.tmp / "p5.bin", torch_pickle(0, (2,), (1,), 7), RAW[:8])
        ),
        ValueError,
        "holds 8 bytes",
        id="storage shorter than declared",
    ),
    pytest.param(
        lambda c: load_torch_bin(
            write_bin(c.tmp / "p6.bin", torch_pickle(0, (2,), (1,), 7), RAW + b"\x00" * 4)
        ),
        ValueError,
        "holds 32 bytes",
        id="storage longer than declared",
    ),
    pytest.param(
        lambda c: load_torch_bin(
            write_bin(c.tmp / "p7.bin", torch_pickle(0, (100,), (0,), 7), RAW)
        ),
        ValueError,
        "overlapping strides",
        id="expanded (overlapping) tensor",
    ),
    pytest.param(
        lambda c: load_torch_bin(
            write_bin(c.tmp / "p8.bin", torch_pickle(0, (2**40, 2**40, 0), (1, 1, 1), 7), RAW)
        ),
        ValueError,
        "too large",
        id="size beyond any array",
    ),
    pytest.param(
        lambda c: load_torch_bin(c.write("p9.bin", b"garbage")),
        ValueError,
        "not a zip-format",
        id="not a zip",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
