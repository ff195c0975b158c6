"""Strict conversion: every malformed checkpoint is refused with an error naming the problem."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zipfile

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import hydra_jax as hj
from hydra_jax.convert import UnsafePickleError
from hydra_jax.convert.torch_pickle import load_torch_bin
from hydra_jax.models import BertConfig, EncoderConfig, ViTConfig


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT classifier exported by us: the torch-free way to get a valid HF directory."""
    config = BertConfig(
        EncoderConfig((2, 2), 12, 6, 20, "gelu", 1e-12, pre_norm=False),
        vocab_size=30, max_positions=10, type_vocab_size=2, num_labels=3,
    )  # fmt: skip
    model = hj.Model.init(config, jax.random.key(0))
    path = tmp_path_factory.mktemp("bert")
    hj.save_pretrained(model, path)
    return model, path


def copy_with(src, dst, *, config=None, tensors=None):
    """Writes `dst` as `src` with an edited config and/or tensor dict."""
    dst.mkdir(exist_ok=True)
    hf = json.loads((src / "config.json").read_text())
    tensors_in = load_file(src / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(config(hf) if config else hf))
    save_file(tensors(tensors_in) if tensors else tensors_in, dst / "model.safetensors")
    return dst


def test_roundtrip_is_exact(bert_dir):
    model, path = bert_dir
    loaded = hj.from_pretrained(path)
    assert loaded.config == model.config
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_vit_roundtrip_is_exact(tmp_path):
    config = ViTConfig(
        EncoderConfig((2, 2), 8, 4, 10, "gelu", 1e-6, pre_norm=True),
        image_size=6, patch_size=3, num_channels=2, num_labels=4,
    )  # fmt: skip
    model = hj.Model.init(config, jax.random.key(1))
    hj.save_pretrained(model, tmp_path)
    loaded = hj.from_pretrained(tmp_path)
    assert loaded.config == model.config
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_unknown_model_type(bert_dir, tmp_path):
    path = copy_with(bert_dir[1], tmp_path, config=lambda c: {**c, "model_type": "roberta"})
    with pytest.raises(hj.ConversionError, match="unknown model_type 'roberta'"):
        hj.from_pretrained(path)


def test_unhandled_config_field(bert_dir, tmp_path):
    path = copy_with(bert_dir[1], tmp_path, config=lambda c: {**c, "rotary_base": 10000})
    with pytest.raises(
        hj.ConversionError, match=r"unhandled BERT config field\(s\) \['rotary_base'\]"
    ):
        hj.from_pretrained(path)


def test_unsupported_value_of_handled_field(bert_dir, tmp_path):
    path = copy_with(
        bert_dir[1], tmp_path, config=lambda c: {**c, "position_embedding_type": "relative_key"}
    )
    with pytest.raises(hj.ConversionError, match="position_embedding_type='relative_key'"):
        hj.from_pretrained(path)


def test_decoder_config_refused(bert_dir, tmp_path):
    path = copy_with(bert_dir[1], tmp_path, config=lambda c: {**c, "is_decoder": True})
    with pytest.raises(hj.ConversionError, match="is_decoder=True"):
        hj.from_pretrained(path)


def test_missing_tensor(bert_dir, tmp_path):
    name = "bert.encoder.layer.1.attention.self.key.bias"

    def drop(t):
        return {k: v for k, v in t.items() if k != name}

    path = copy_with(bert_dir[1], tmp_path, tensors=drop)
    with pytest.raises(
        hj.ConversionError, match=r"missing tensor 'encoder\.layer\.1\.attention\.self\.key\.bias'"
    ):
        hj.from_pretrained(path)


def test_unused_extra_tensor(bert_dir, tmp_path):
    def add(t):
        return {**t, "bert.encoder.layer.0.attention.self.rotary.weight": np.zeros(3, np.float32)}

    path = copy_with(bert_dir[1], tmp_path, tensors=add)
    with pytest.raises(
        hj.ConversionError,
        match=r"does not use: \['encoder.layer.0.attention.self.rotary.weight'\]",
    ):
        hj.from_pretrained(path)


def test_misshaped_tensor(bert_dir, tmp_path):
    name = "bert.encoder.layer.0.intermediate.dense.weight"

    def reshape(t):
        return {**t, name: np.zeros((21, 12), np.float32)}

    path = copy_with(bert_dir[1], tmp_path, tensors=reshape)
    with pytest.raises(
        hj.ConversionError,
        match=r"intermediate.dense.weight' has shape \(21, 12\), expected \(20, 12\)",
    ):
        hj.from_pretrained(path)


def test_not_a_directory_never_downloads(tmp_path):
    with pytest.raises(hj.ConversionError, match="never downloads"):
        hj.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_bin_with_foreign_global_is_refused_without_running_it(bert_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text((bert_dir[1] / "config.json").read_text())
    with zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"weight": _Exploit()}))
    with pytest.raises(
        UnsafePickleError, match=r"refusing to load pickle global (posix|os)\.system"
    ):
        hj.from_pretrained(tmp_path)
    assert not (tmp_path / "pwned").exists()


def _opcodes_for_strided_tensor() -> bytes:
    """Protocol-2 pickle of `{"t": _rebuild_tensor_v2(FloatStorage key "0", offset 1, size (2, 3),
    stride (1, 2))}`, written opcode by opcode as `torch.save` would, so no torch is needed."""

    def text(s: str) -> bytes:
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def integer(i: int) -> bytes:
        return b"J" + struct.pack("<i", i)

    def global_(module: str, name: str) -> bytes:
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    persistent_id = b"(" + text("storage") + global_("torch", "FloatStorage")
    persistent_id += text("0") + text("cpu") + integer(7) + b"tQ"  # BINPERSID
    args = b"(" + persistent_id + integer(1) + b"(" + integer(2) + integer(3) + b"t"
    args += b"(" + integer(1) + integer(2) + b"t" + b"\x89N" + b"t"  # requires_grad, hooks
    tensor = global_("torch._utils", "_rebuild_tensor_v2") + args + b"R"
    return b"\x80\x02}" + text("t") + tensor + b"s."


def test_bin_reader_rebuilds_strided_tensors(tmp_path):
    """A hand-written torch-format archive: a [2, 3] tensor stored transposed, offset by one."""
    storage = np.arange(7, dtype=np.float32)
    with zipfile.ZipFile(tmp_path / "x.bin", "w") as archive:
        archive.writestr("x/data.pkl", _opcodes_for_strided_tensor())
        archive.writestr("x/data/0", storage.tobytes())
        archive.writestr("x/byteorder", "little")
    loaded = load_torch_bin(tmp_path / "x.bin")
    np.testing.assert_array_equal(loaded["t"], storage[1:].reshape(3, 2).T)
