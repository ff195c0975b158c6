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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.convert import UnsafePickleError
from hydra_jax.convert.torch_pickle import load_torch_bin
from hydra_jax.models import BertConfig


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT classifier exported by us: the torch-free way to get a valid HF directory."""
    config = BertConfig(
        testing.encoder(layers=2, heads=2, head_dim=6, mlp_dim=20),
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
    config = testing.vit(layers=2, heads=2, head_dim=4, mlp_dim=10, layer_norm_eps=1e-6,
                         image_size=6, patch_size=3, num_channels=2, num_labels=4)  # fmt: skip
    model = hj.Model.init(config, jax.random.key(1))
    hj.save_pretrained(model, tmp_path)
    loaded = hj.from_pretrained(tmp_path)
    assert loaded.config == model.config
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_unknown_model_type(bert_dir, tmp_path):
    path = copy_with(bert_dir[1], tmp_path, config=lambda c: {**c, "model_type": "mpnet"})
    with pytest.raises(hj.ConversionError, match="unknown model_type 'mpnet'"):
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


def _torch_pickle(offset=1, size=(2, 3), stride=(1, 2), numel=7, storage="FloatStorage") -> bytes:
    """Protocol-2 pickle of `{"t": _rebuild_tensor_v2(<storage> key "0" of `numel` elements,
    offset, size, stride)}`, written opcode by opcode as `torch.save` would (no torch needed).
    Integers are LONG1 opcodes, so any value, negative or huge, can be written."""

    def text(s: str) -> bytes:
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    def integer(i: int) -> bytes:
        raw = i.to_bytes(max(1, (i.bit_length() + 8) // 8), "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw

    def global_(module: str, name: str) -> bytes:
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def tuple_(values) -> bytes:
        return b"(" + b"".join(integer(v) for v in values) + b"t"

    persistent_id = b"(" + text("storage") + global_("torch", storage)
    persistent_id += text("0") + text("cpu") + integer(numel) + b"tQ"  # BINPERSID
    args = b"(" + persistent_id + integer(offset) + tuple_(size) + tuple_(stride)
    args += b"\x89N" + b"t"  # requires_grad, hooks
    tensor = global_("torch._utils", "_rebuild_tensor_v2") + args + b"R"
    return b"\x80\x02}" + text("t") + tensor + b"s."


def _write_bin(path, pickled: bytes, storage: bytes):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x/data.pkl", pickled)
        archive.writestr("x/data/0", storage)
        archive.writestr("x/byteorder", "little")
    return path


def test_bin_reader_rebuilds_strided_tensors(tmp_path):
    """A hand-written torch-format archive: a [2, 3] tensor stored transposed, offset by one."""
    storage = np.arange(7, dtype=np.float32)
    loaded = load_torch_bin(_write_bin(tmp_path / "x.bin", _torch_pickle(), storage.tobytes()))
    np.testing.assert_array_equal(loaded["t"], storage[1:].reshape(3, 2).T)


def _reference(storage: np.ndarray, offset: int, size: tuple, stride: tuple) -> np.ndarray:
    """Element-by-element gather: what a tensor that fits its storage holds."""
    out = np.zeros(size, storage.dtype)
    if out.size == 0:
        return out
    for index in np.ndindex(*size):
        out[index] = storage[offset + sum(i * s for i, s in zip(index, stride, strict=True))]
    return out


_INDEX = st.one_of(st.integers(-3, 12), st.sampled_from([2**31, 2**40, 2**63 - 1, -(2**40)]))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rank=st.integers(0, 3),
    data=st.data(),
    numel=st.integers(0, 40) | st.sampled_from([2**40, -1]),
    byte_error=st.sampled_from([0, 0, 0, -4, 4, -1]),
    offset=_INDEX,
)
def test_bin_reader_refuses_hostile_geometry_cleanly(
    tmp_path, rank, data, numel, byte_error, offset
):
    """Any size/stride/offset/storage length: the exact tensor, or a ValueError naming it."""
    size = tuple(data.draw(st.lists(_INDEX, min_size=rank, max_size=rank)))
    stride = tuple(data.draw(st.lists(_INDEX, min_size=rank, max_size=rank)))
    real = max(0, min(numel, 40))
    storage = np.arange(real, dtype=np.float32) + 0.5
    raw = storage.tobytes()
    raw = raw[: max(0, len(raw) + byte_error)] if byte_error < 0 else raw + b"\0" * byte_error
    path = _write_bin(tmp_path / "h.bin", _torch_pickle(offset, size, stride, numel), raw)
    fits = (
        min((numel, offset, *size, *stride), default=0) >= 0
        and numel <= 40
        and len(raw) == 4 * numel
        and (
            0 in size
            or offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) < numel
        )
        and np.prod(size, dtype=object) <= numel
        and np.prod([n for n in size if n], dtype=object) * 4 < 2**62
    )
    if fits:
        np.testing.assert_array_equal(
            load_torch_bin(path)["t"], _reference(storage, offset, size, stride)
        )
    else:
        with pytest.raises(ValueError, match=r"h\.bin, tensor 't'"):
            load_torch_bin(path)


def test_bin_reader_names_a_tensor_past_its_storage(tmp_path):
    raw = np.zeros(7, np.float32).tobytes()
    path = _write_bin(tmp_path / "w.bin", _torch_pickle(offset=2, size=(3, 3), stride=(3, 1)), raw)
    with pytest.raises(ValueError, match=r"w\.bin, tensor 't'.*reach element 10, past the end"):
        load_torch_bin(path)
    short = _write_bin(tmp_path / "s.bin", _torch_pickle(), raw[:-4])
    with pytest.raises(ValueError, match=r"holds 24 bytes, but the pickle declares 7 x"):
        load_torch_bin(short)


@pytest.mark.parametrize(
    ("dtype", "message"),
    [(np.int8, "has dtype int8, but the model expects floating-point float32"),
     (np.bool_, "has dtype bool"),
     (np.float32, "has 1 NaN/inf values")],
)  # fmt: skip
def test_integer_bool_and_non_finite_weights_are_refused_by_name(
    bert_dir, tmp_path, dtype, message
):
    def edit(t):
        weight = t["bert.pooler.dense.weight"]
        if dtype == np.float32:
            weight = weight.copy()
            weight[0, 0] = np.nan
        return {**t, "bert.pooler.dense.weight": weight.astype(dtype)}

    path = copy_with(bert_dir[1], tmp_path / "d", tensors=edit)
    with pytest.raises(hj.ConversionError, match=rf"d: tensor 'pooler.dense.weight' {message}"):
        hj.from_pretrained(path)


def test_half_and_double_weights_convert_and_say_so_once(bert_dir, tmp_path, caplog):
    model, src = bert_dir
    names = ["bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight"]
    dtypes = [np.float16, np.float16, np.float64]
    path = copy_with(src, tmp_path / "h", tensors=lambda t: {
        **t, **{n: t[n].astype(d) for n, d in zip(names, dtypes, strict=True)}})  # fmt: skip
    with caplog.at_level("WARNING", logger="hydra_jax.convert.common"):
        loaded = hj.from_pretrained(path)
    assert [r.getMessage() for r in caplog.records] == [
        "converted 2 float16, 1 float64 tensors to float32 parameters"
    ]
    assert loaded.params["pooler"]["kernel"].dtype == np.float32
    np.testing.assert_allclose(loaded.params["pooler"]["kernel"], model.params["pooler"]["kernel"],
                               atol=1e-3)  # fmt: skip


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda d: (d / "config.json").write_text("{oops"), r"config\.json is not valid JSON"),
        (lambda d: (d / "config.json").write_text("[1, 2]"), r"holds a JSON list, not an object"),
        (lambda d: _edit_json(d, lambda h: h.pop("hidden_size")),
         r"f: config lacks the required field 'hidden_size'"),
        (lambda d: _edit_json(d, lambda h: h.update(hidden_size="12")),
         r"field 'hidden_size' is '12' \(str\), expected int"),
        (lambda d: _edit_json(d, lambda h: h.update(layer_norm_eps=True)),
         r"field 'layer_norm_eps' is True \(bool\), expected float or int"),
        (lambda d: _truncate(d / "model.safetensors"),
         r"model\.safetensors is not a readable safetensors file \(truncated or corrupt\?\)"),
    ],
)  # fmt: skip
def test_file_errors_name_the_file_and_the_problem(bert_dir, tmp_path, write, message):
    path = copy_with(bert_dir[1], tmp_path / "f")
    write(path)
    with pytest.raises(hj.ConversionError, match=message):
        hj.from_pretrained(path)


def _edit_json(directory, edit):
    hf = json.loads((directory / "config.json").read_text())
    edit(hf)
    (directory / "config.json").write_text(json.dumps(hf))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_every_family_and_kind_reaches_each_table():
    """The touch points of a model family (CONTRIBUTING, "A model family") and of an ensemble
    kind: every config class of `ARCHITECTURES` and `kinds.KINDS` is exported by
    `hydra_jax.models` and known to our format; every converter of `convert.CONVERTERS` declares
    the HF `model_type`s it reads, and `FORMATS` takes them from there; the presets' families
    report a `model_type` a converter reads."""
    from hydra_jax.convert import CONVERTERS, FORMATS, native
    from hydra_jax.models import ARCHITECTURES, kinds
    from hydra_jax.models.architectures import architecture

    known = native._config_classes()
    for cls in (*ARCHITECTURES, *kinds.KINDS):
        assert cls.__name__ in known and getattr(hj.models, cls.__name__) is cls, cls
    types = [t for m in CONVERTERS for t in m.MODEL_TYPES]
    assert sorted(types) == sorted(FORMATS) and len(set(types)) == len(types)
    for m in CONVERTERS:
        assert all(FORMATS[t].load is m.load for t in m.MODEL_TYPES), m.__name__
    for preset in (testing.bert(), testing.vit(), testing.clip(), testing.dual_encoder()):
        assert architecture(preset).hf_model_type(preset) in FORMATS, type(preset).__name__
