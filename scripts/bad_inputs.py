"""Tries bad inputs, as a hostile or careless user would, and counts how each one ends.

    python scripts/bad_inputs.py [--verbose]

Every case names the error type and a fragment its message must contain. Outcomes: `clear` (that
error, with that fragment), `unclear` (another error or message), `silent` (no error: something
ran on bad input), `crash` (the process died: each case runs in a subprocess when it touches
native code). docs/reliability.md quotes the totals.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import io
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import jax
import ml_collections
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import hydra_jax as hj  # noqa: E402
from hydra_jax import metrics  # noqa: E402
from hydra_jax.convert.torch_pickle import load_torch_bin  # noqa: E402
from hydra_jax.data import TextEncoder, TokenizedSet, image_sources  # noqa: E402
from hydra_jax.experiments.workdir import Workdir, WorkdirError  # noqa: E402
from hydra_jax.heads import keep_mask, score  # noqa: E402
from hydra_jax.models import (  # noqa: E402
    BertConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    DualEncoderConfig,
    EncoderConfig,
    ViTConfig,
    sharding,
    with_classifier,
)
from hydra_jax.training import TrainSettings, fit  # noqa: E402

Case = tuple[str, Callable[[], object], type, str]
IDX_HEADER = b"\0\0\x08\x01" + (9).to_bytes(4, "big")  # unsigned bytes, 1-D, 9 of them
BLANK = np.zeros((1, 28, 28), np.uint8)  # one grey image


def tiny_models():
    bert = with_classifier(
        hj.Model.init(
            BertConfig(EncoderConfig((4, 4), 16, 4, 20, "gelu", 1e-12, False), 50, 12, 2),
            jax.random.key(0),
        ),
        3,
        jax.random.key(1),
    )
    vit = hj.Model.init(
        ViTConfig(EncoderConfig((2,), 8, 4, 10, "gelu", 1e-12, True), 8, 4, 3, num_labels=2),
        jax.random.key(2),
    )
    clip = hj.Model.init(
        CLIPConfig(
            CLIPTextConfig(
                EncoderConfig((2,), 8, 4, 10, "quick_gelu", 1e-5, True, True), 30, 8, 29
            ),
            CLIPVisionConfig(EncoderConfig((2,), 8, 4, 10, "quick_gelu", 1e-5, True), 8, 4),
            projection_dim=6,
        ),
        jax.random.key(3),
    )
    return bert, vit, clip


def torch_pickle(offset, size, stride, numel) -> bytes:
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


def cases(tmp: Path) -> list[Case]:
    bert, vit, clip = tiny_models()
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, (3, 6)).astype(np.int32)
    mask = np.ones_like(ids)
    good = {"input_ids": ids, "attention_mask": mask}
    pixels = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    probs = np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    labels = np.array([1, 0, 1])
    hj.save_pretrained(bert, tmp / "bert")

    def edited(name: str, config=None, tensors=None, remove=None) -> Path:
        from safetensors.numpy import load_file, save_file

        path = tmp / name
        shutil.copytree(tmp / "bert", path)
        hf = json.loads((path / "config.json").read_text())
        t = load_file(path / "model.safetensors")
        if config:
            hf = config(hf)
        if tensors:
            t = tensors(t)
        (path / "config.json").write_text(json.dumps(hf) if not isinstance(hf, str) else hf)
        save_file(t, path / "model.safetensors")
        if remove:
            (path / remove).unlink()
        return path

    def with_(**kw):
        return lambda hf: {**hf, **kw}

    def without(key):
        return lambda hf: {k: v for k, v in hf.items() if k != key}

    def tensor_edit(name, f):
        return lambda t: {**t, name: f(t[name])}

    def drop_tensor(name):
        return lambda t: {k: v for k, v in t.items() if k != name}

    pooler = "bert.pooler.dense.weight"
    raw = np.arange(7, dtype=np.float32).tobytes()
    V = ValueError
    C = hj.ConversionError
    out: list[Case] = [
        # --- checkpoints: directories, files, config fields
        ("not a directory", lambda: hj.from_pretrained("org/model"), C, "never downloads"),
        (
            "no config.json",
            lambda: hj.from_pretrained(edited("c1", remove="config.json")),
            C,
            "no config.json",
        ),
        (
            "no weights file",
            lambda: hj.from_pretrained(edited("c2", remove="model.safetensors")),
            C,
            "neither model.safetensors",
        ),
        (
            "invalid JSON",
            lambda: hj.from_pretrained(edited("c3", config=lambda h: "{oops")),
            C,
            "not valid JSON",
        ),
        (
            "config is a list",
            lambda: hj.from_pretrained(edited("c4", config=lambda h: [1])),
            C,
            "not an object",
        ),
        (
            "unknown model_type",
            lambda: hj.from_pretrained(edited("c5", with_(model_type="gpt9"))),
            C,
            "unknown model_type",
        ),
        (
            "unknown field",
            lambda: hj.from_pretrained(edited("c6", with_(rotary=1))),
            C,
            "unhandled BERT config field",
        ),
        (
            "missing hidden_size",
            lambda: hj.from_pretrained(edited("c7", without("hidden_size"))),
            C,
            "required field 'hidden_size'",
        ),
        (
            "hidden_size a string",
            lambda: hj.from_pretrained(edited("c8", with_(hidden_size="16"))),
            C,
            "'hidden_size' is '16'",
        ),
        (
            "layers a float",
            lambda: hj.from_pretrained(edited("c9", with_(num_hidden_layers=2.0))),
            C,
            "'num_hidden_layers' is 2.0",
        ),
        (
            "eps a bool",
            lambda: hj.from_pretrained(edited("c10", with_(layer_norm_eps=True))),
            C,
            "'layer_norm_eps' is True",
        ),
        (
            "heads do not divide width",
            lambda: hj.from_pretrained(edited("c11", with_(num_attention_heads=3))),
            C,
            "not divisible",
        ),
        (
            "zero layers",
            lambda: hj.from_pretrained(edited("c12", with_(num_hidden_layers=0))),
            C,
            "sizes must be positive",
        ),
        (
            "unknown activation",
            lambda: hj.from_pretrained(edited("c13", with_(hidden_act="mish"))),
            C,
            "hidden_act='mish' unsupported",
        ),
        (
            "decoder config",
            lambda: hj.from_pretrained(edited("c14", with_(is_decoder=True))),
            C,
            "is_decoder=True",
        ),
        (
            "relative positions",
            lambda: hj.from_pretrained(
                edited("c15", with_(position_embedding_type="relative_key"))
            ),
            C,
            "only 'absolute'",
        ),
        (
            "missing tensor",
            lambda: hj.from_pretrained(edited("t1", tensors=drop_tensor(pooler))),
            C,
            "missing tensor 'pooler.dense.weight'",
        ),
        (
            "missing attention tensor",
            lambda: hj.from_pretrained(
                edited("t9", tensors=drop_tensor("bert.encoder.layer.1.attention.self.key.bias"))
            ),
            C,
            "missing tensor 'encoder.layer.1.attention.self.key.bias'",
        ),
        (
            "extra tensor",
            lambda: hj.from_pretrained(edited("t2", tensors=lambda t: {**t, "x.y": np.ones(2)})),
            C,
            "does not use",
        ),
        (
            "mis-shaped tensor",
            lambda: hj.from_pretrained(
                edited("t3", tensors=tensor_edit(pooler, lambda x: x[:, :3]))
            ),
            C,
            "has shape (16, 3)",
        ),
        (
            "int8 weights",
            lambda: hj.from_pretrained(
                edited("t4", tensors=tensor_edit(pooler, lambda x: x.astype(np.int8)))
            ),
            C,
            "dtype int8",
        ),
        (
            "bool weights",
            lambda: hj.from_pretrained(edited("t5", tensors=tensor_edit(pooler, lambda x: x > 0))),
            C,
            "dtype bool",
        ),
        (
            "NaN weight",
            lambda: hj.from_pretrained(
                edited("t6", tensors=tensor_edit(pooler, lambda x: x * np.nan))
            ),
            C,
            "NaN/inf",
        ),
        (
            "inf weight",
            lambda: hj.from_pretrained(
                edited("t7", tensors=tensor_edit(pooler, lambda x: x + np.inf))
            ),
            C,
            "NaN/inf",
        ),
        ("truncated safetensors", lambda: _truncated(edited("t8")), C, "truncated or corrupt"),
        # --- .bin pickles
        (
            "pickle running os.system",
            lambda: _exploit(tmp),
            hj.convert.UnsafePickleError,
            "refusing to load pickle global",
        ),
        (
            "tensor past its storage",
            lambda: load_torch_bin(
                write_bin(tmp / "p1.bin", torch_pickle(2, (3, 3), (3, 1), 7), raw)
            ),
            V,
            "past the end",
        ),
        (
            "huge stride",
            lambda: load_torch_bin(
                write_bin(tmp / "p2.bin", torch_pickle(0, (2, 2), (2**40, 1), 7), raw)
            ),
            V,
            "past the end",
        ),
        (
            "negative stride",
            lambda: load_torch_bin(write_bin(tmp / "p3.bin", torch_pickle(0, (2,), (-1,), 7), raw)),
            V,
            "non-negative",
        ),
        (
            "negative offset",
            lambda: load_torch_bin(write_bin(tmp / "p4.bin", torch_pickle(-3, (2,), (1,), 7), raw)),
            V,
            "non-negative",
        ),
        (
            "storage shorter than declared",
            lambda: load_torch_bin(
                write_bin(tmp / "p5.bin", torch_pickle(0, (2,), (1,), 7), raw[:8])
            ),
            V,
            "holds 8 bytes",
        ),
        (
            "storage longer than declared",
            lambda: load_torch_bin(
                write_bin(tmp / "p6.bin", torch_pickle(0, (2,), (1,), 7), raw + b"\0" * 4)
            ),
            V,
            "holds 32 bytes",
        ),
        (
            "expanded (overlapping) tensor",
            lambda: load_torch_bin(
                write_bin(tmp / "p7.bin", torch_pickle(0, (100,), (0,), 7), raw)
            ),
            V,
            "overlapping strides",
        ),
        (
            "size beyond any array",
            lambda: load_torch_bin(
                write_bin(tmp / "p8.bin", torch_pickle(0, (2**40, 2**40, 0), (1, 1, 1), 7), raw)
            ),
            V,
            "too large",
        ),
        (
            "not a zip",
            lambda: load_torch_bin(_file(tmp / "p9.bin", b"garbage")),
            V,
            "not a zip-format",
        ),
        # --- model inputs
        ("id >= vocab", lambda: bert(**{**good, "input_ids": ids + 49}), V, "[0, 50)"),
        ("id -1", lambda: bert(**{**good, "input_ids": ids * 0 - 1}), V, "-1 at"),
        ("float ids", lambda: bert(**{**good, "input_ids": ids + 0.0}), V, "must be integers"),
        ("1-D ids", lambda: bert(input_ids=ids[0]), V, "[B, T]"),
        (
            "too many tokens",
            lambda: bert(input_ids=np.ones((1, 13), np.int32)),
            V,
            "more than the model's 12 positions",
        ),
        ("token type 2", lambda: bert(**good, token_type_ids=ids * 0 + 2), V, "[0, 2)"),
        (
            "mask of another shape",
            lambda: bert(input_ids=ids, attention_mask=mask[:, :3]),
            V,
            "attention_mask has shape",
        ),
        (
            "all-padding example",
            lambda: bert(input_ids=ids, attention_mask=mask * np.array([[1], [0], [1]])),
            V,
            "all padding",
        ),
        ("empty batch", lambda: bert(input_ids=np.zeros((0, 4), np.int32)), V, "empty batch"),
        (
            "pixels to a text model",
            lambda: bert(**good, pixel_values=pixels),
            TypeError,
            "unexpected inputs",
        ),
        (
            "NHWC pixels",
            lambda: vit(pixel_values=pixels.transpose(0, 2, 3, 1)),
            V,
            "channels last (NHWC)",
        ),
        ("wrong image size", lambda: vit(pixel_values=pixels[:, :, :4, :4]), V, "[B, C, H, W]"),
        ("wrong channel count", lambda: vit(pixel_values=pixels[:, :1]), V, "[B, C, H, W]"),
        ("CLIP id >= vocab", lambda: clip(input_ids=np.full((1, 4), 30)), V, "[0, 30)"),
        (
            "head mask transposed",
            lambda: bert(**good, head_mask=np.ones((4, 2))),
            V,
            "head_mask has shape",
        ),
        ("head mask flat", lambda: bert(**good, head_mask=np.ones(8)), V, "head_mask has shape"),
        (
            "NaN head mask",
            lambda: bert(**good, head_mask=np.full((2, 4), np.nan)),
            V,
            "head_mask contains NaN/inf",
        ),
        (
            "CLIP head mask name",
            lambda: clip(input_ids=ids % 29, head_mask=np.ones((1, 2))),
            TypeError,
            "unexpected inputs",
        ),
        # --- head scores and selection
        (
            "unknown scoring method",
            lambda: score(bert, [good], method="magic"),
            V,
            "unknown scoring method",
        ),
        (
            "gradient score without batches",
            lambda: score(bert, None, method="his"),
            V,
            "needs calibration batches",
        ),
        (
            "score batches without labels",
            lambda: score(bert, [good], method="his"),
            V,
            "needs `labels`",
        ),
        (
            "score an empty iterable",
            lambda: score(bert, [], method="his"),
            V,
            "no calibration examples",
        ),
        (
            "calibration labels outside the classes",
            lambda: score(bert, [{**good, "labels": np.array([0, 7, 1])}], method="his"),
            V,
            "labels must be classes in",
        ),
        (
            "HIS and entropy of different shapes",
            lambda: hj.heads.hies(np.ones((2, 4)), np.ones((3, 4)), 0.5),
            V,
            "his and entropy must both be [L, N]",
        ),
        (
            "a classifier of zero classes",
            lambda: hj.with_classifier(bert, 0, jax.random.key(0)),
            V,
            "num_labels must be a positive integer",
        ),
        (
            "alpha 1.5",
            lambda: hj.heads.hies(np.ones((2, 4)), np.ones((2, 4)), 1.5),
            V,
            "alpha must be in [0, 1]",
        ),
        ("ratio 1.0", lambda: keep_mask(np.ones((2, 4)), ratio=1.0), V, "pruning ratio"),
        ("ratio -0.1", lambda: keep_mask(np.ones((2, 4)), ratio=-0.1), V, "pruning ratio"),
        (
            "both ratio and keep",
            lambda: keep_mask(np.ones((2, 4)), ratio=0.5, keep_per_layer=1),
            V,
            "exactly one",
        ),
        (
            "keep 0 per layer",
            lambda: keep_mask(np.ones((2, 4)), keep_per_layer=0),
            V,
            "keep_per_layer",
        ),
        ("NaN scores", lambda: keep_mask(np.full((2, 4), np.nan), ratio=0.5), V, "NaN"),
        (
            "a fractional keep_per_layer",
            lambda: keep_mask(np.ones((2, 4)), keep_per_layer=1.5),
            V,
            "keep_per_layer must be an integer",
        ),
        (
            "scores passed to compact as a keep mask",
            lambda: hj.heads.compact(bert, np.random.default_rng(0).random((2, 4))),
            V,
            "keep mask must be boolean",
        ),
        (
            "one head set where members_from wants [M, L, N]",
            lambda: hj.ensembles.members_from(bert, np.ones((2, 4), bool)),
            V,
            "head_sets must be [M, L, N]",
        ),
        ("3-D scores", lambda: keep_mask(np.ones((2, 4, 1)), ratio=0.5), V, "[L, N]"),
        (
            "compact with wrong keep",
            lambda: hj.heads.compact(bert, np.ones((3, 4), bool)),
            V,
            "keep mask has shapes",
        ),
        # --- ensembles
        (
            "a Hydra of zero stratified members",
            lambda: hj.ensembles.stratified_head_sets(np.ones((2, 4)), 0),
            V,
            "num_members must be a positive integer",
        ),
        (
            "MC dropout with no samples",
            lambda: hj.ensembles.baselines.mc_dropout(bert, 0),
            V,
            "samples must be a positive integer",
        ),
        (
            "more calibration examples than the set has",
            lambda: hj.data.labelled_batches(TokenizedSet(list(ids), labels), 8, 0, 2),
            V,
            "8 calibration examples asked of a set of 3",
        ),
        (
            "evaluation batch size 0",
            lambda: hj.data.eval_batches(np.ones(3), 0),
            V,
            "batch_size must be a positive integer",
        ),
        (
            "a negative subset size",
            lambda: hj.data.subset(TokenizedSet(list(ids), labels), -1),
            V,
            "subset size must be a non-negative integer",
        ),
        ("one member", lambda: hj.hydra.fuse([bert]), V, "at least two members"),
        (
            "unequal members",
            lambda: hj.hydra.fuse(
                [
                    hj.heads.compact(bert, np.array([[1, 1, 0, 0]] * 2, bool)),
                    hj.heads.compact(bert, np.array([[1, 0, 0, 0]] * 2, bool)),
                ]
            ),
            V,
            "unequal head counts",
        ),
        ("mixed families", lambda: hj.hydra.fuse([bert, vit]), V, "must all be"),
        (
            "stratified uneven split",
            lambda: hj.hydra.stratified_head_sets(np.ones((2, 4)), 3),
            V,
            "do not split evenly",
        ),
        # --- metrics
        (
            "logits as probs",
            lambda: metrics.classification(np.log(probs) + 2, labels),
            V,
            "softmax(logits)",
        ),
        (
            "rows not summing to 1",
            lambda: metrics.classification(probs * 1.1, labels),
            V,
            "rows summing",
        ),
        (
            "label out of range",
            lambda: metrics.classification(probs, labels + 1),
            V,
            "labels must be classes in [0, 2)",
        ),
        ("float labels", lambda: metrics.classification(probs, labels + 0.0), V, "integer classes"),
        (
            "labels of another length",
            lambda: metrics.classification(probs, labels[:2]),
            V,
            "labels must be [B]",
        ),
        ("NaN probabilities", lambda: metrics.classification(probs * np.nan, labels), V, "NaN/inf"),
        (
            "empty probabilities",
            lambda: metrics.classification(np.zeros((0, 2)), labels[:0]),
            V,
            "empty",
        ),
        ("OOD set of one", lambda: metrics.ood(np.arange(5.0), np.array([1.0])), V, "at least 2"),
        (
            "NaN OOD scores",
            lambda: metrics.ood(np.arange(5.0), np.array([1.0, np.nan])),
            V,
            "NaN/inf",
        ),
        ("unknown OOD score", lambda: metrics.ood_score(probs, "magic"), V, "unknown OOD score"),
        (
            "logits as OOD-score probabilities",
            lambda: metrics.ood_score(np.log(probs) + 1.5, "entropy"),
            V,
            "not probabilities",
        ),
        (
            "confidences and correct flags of different lengths",
            lambda: metrics.calibration(probs.max(-1), labels[:2] == 1),
            V,
            "3 confidences but 2",
        ),
        (
            "a percentage as a confidence",
            lambda: metrics.calibration(100 * probs.max(-1), labels == 1),
            V,
            "confidences must lie in [0, 1]",
        ),
        (
            "member logits as diversity probabilities",
            lambda: metrics.diversity(np.log(np.stack([probs, probs], 1))),
            V,
            "not probabilities",
        ),
        (
            "per-member OOD scores [N, M]",
            lambda: metrics.ood(np.ones((5, 2)), np.arange(3.0)),
            V,
            "id_scores must be 1-D",
        ),
        (
            "a bootstrap level in percent",
            lambda: metrics.auroc_difference(
                np.arange(5.0), [np.arange(3.0)], np.arange(5.0), [np.arange(3.0)], level=95
            ),
            V,
            "level must be in (0, 1)",
        ),
        (
            "column-vector labels for misclassification",
            lambda: metrics.misclassification(probs, labels[:, None]),
            V,
            "labels must be [B]",
        ),
        (
            "unknown FPR95 rule",
            lambda: metrics.ood(np.arange(5.0), np.arange(3.0), fpr95_convention="x"),
            V,
            "fpr95_convention",
        ),
        # --- training settings and configs
        ("batch size 0", lambda: TrainSettings(batch_size=0), V, "train.batch_size"),
        (
            "evaluation batch size 0 in a config",
            lambda: Workdir(tmp / "never_claimed").claim(
                ml_collections.ConfigDict({"eval": {"batch_size": 0}})
            ),
            V,
            "eval.batch_size must be a positive integer",
        ),
        (
            "a negative train_limit in a config",
            lambda: Workdir(tmp / "never_claimed").claim(
                ml_collections.ConfigDict({"data": {"train_limit": -1}})
            ),
            V,
            "data.train_limit must be a non-negative integer",
        ),
        (
            "a token set with fewer labels than sentences",
            lambda: TokenizedSet(list(ids), labels[:2]),
            V,
            "labels must be [N], one per token array",
        ),
        (
            "a token cap below [CLS] and [SEP]",
            lambda: TextEncoder(hj.minilm_l6_path(), max_tokens=1),
            V,
            "max_tokens ([CLS], a token, [SEP]) must be an integer of at least 3",
        ),
        (
            "OOD examples (label -1) in a training set",
            lambda: fit(
                bert,
                TokenizedSet(list(ids), np.array([0, -1, 1])),
                TrainSettings(batch_size=2),
                tmp / "never_written",
            ),
            V,
            "training set: labels must be classes in",
        ),
        ("negative epochs", lambda: TrainSettings(epochs=-1.0), V, "train.epochs"),
        (
            "checkpoint every 0",
            lambda: TrainSettings(checkpoint_every=0),
            V,
            "train.checkpoint_every",
        ),
        (
            "warm-up fraction 1",
            lambda: TrainSettings(warmup_fraction=1.0),
            V,
            "train.warmup_fraction",
        ),
        (
            "negative learning rate",
            lambda: TrainSettings(learning_rate=-1e-3),
            V,
            "train.learning_rate",
        ),
        (
            "fractional batch size",
            lambda: TrainSettings(batch_size=2.5),
            V,
            "train.batch_size must be an integer",
        ),
        ("infinite epochs", lambda: TrainSettings(epochs=np.inf), V, "train.epochs must be finite"),
        (
            "NaN learning rate",
            lambda: TrainSettings(learning_rate=np.nan),
            V,
            "train.learning_rate must be finite",
        ),
        (
            "evaluate a missing workdir",
            lambda: Workdir(tmp / "none").check(ml_collections.ConfigDict({"a": 1})),
            WorkdirError,
            "no run of this experiment",
        ),
        ("workdir of another config", lambda: _conflict(tmp), WorkdirError, "a: 1 -> 2"),
        # --- image data
        (
            "Fashion-MNIST not fetched",
            lambda: _without_fashion_mnist(tmp),
            FileNotFoundError,
            "apt-get download dataset-fashion-mnist",
        ),
        (
            "OOD wheel not fetched",
            lambda: image_sources.small_digits(tmp / "empty"),
            FileNotFoundError,
            "scikit-learn==1.9.1 wheel not found",
        ),
        (
            "truncated IDX file",
            lambda: image_sources.read_idx(
                _file(
                    tmp / "t.gz", gzip.compress(b"\0\0\x08\x01" + (9).to_bytes(4, "big") + b"abc")
                )
            ),
            ValueError,
            "header says (9,), data holds 3",
        ),
        (
            "not an IDX file",
            lambda: image_sources.read_idx(_file(tmp / "png.gz", gzip.compress(b"\x89PNG\r\n"))),
            ValueError,
            "not an IDX file",
        ),
        (
            "colour images as grey",
            lambda: hj.data.to_pixels(np.zeros((2, 28, 28, 3), np.uint8)),
            V,
            "uint8 grey images [N, H, W]",
        ),
        (
            "float images as grey",
            lambda: hj.data.to_pixels(np.zeros((2, 28, 28))),
            V,
            "uint8 grey images [N, H, W]",
        ),
        (
            "unknown corruption",
            lambda: hj.data.corrupt(np.zeros((1, 28, 28), np.uint8), "fog", 1),
            V,
            "unknown corruption",
        ),
        (
            "severity 0",
            lambda: hj.data.corrupt(np.zeros((1, 28, 28), np.uint8), "blur", 0),
            V,
            "severity must be one of",
        ),
        *_zero_shot_cases(bert, vit),
        (
            "compute dtype float16",
            lambda: hj.models.EncoderConfig((2,), 4, 2, 6, "gelu", 1e-12, False, dtype="float16"),
            V,
            "compute dtype 'float16' is not one of",
        ),
        (
            "with_dtype int8",
            lambda: hj.with_dtype(bert, "int8"),
            V,
            "compute dtype 'int8' is not one of",
        ),
        (
            "a mesh larger than the machine",
            lambda: sharding.make_mesh(data=4096),
            V,
            "needs 4096 devices",
        ),
        (
            "a mesh axis of size 0",
            lambda: sharding.make_mesh(member=0),
            V,
            "mesh axis sizes must be positive integers",
        ),
        (
            "2 processes, a mesh not spanning every device",
            lambda: _as_two_processes(lambda: sharding.make_mesh(data=1)),
            V,
            "with several processes the mesh must span all of them",
        ),
    ]
    return out


def _as_two_processes(call: Callable[[], object]) -> object:
    """`call()` as if JAX had 2 processes (the check reads only `jax.process_count`); needs 2 or
    more devices, as every 2-process run has."""
    with mock.patch.object(jax, "process_count", lambda: 2):
        return call()


def _zero_shot_cases(bert: hj.Model, vit: hj.Model) -> list[Case]:
    """Dual encoders and zero-shot classifiers."""
    from hydra_jax.experiments import zero_shot

    vision = dataclasses.replace(vit.config, num_labels=0)
    text = dataclasses.replace(bert.config, num_labels=0)
    dual = hj.Model.init(DualEncoderConfig(vision, text, 5), jax.random.key(4))

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        return {"input_ids": np.ones((len(texts), 3), np.int32)}

    config = ml_collections.ConfigDict({"held_out": ("trousers",)})
    return [
        (
            "zero-shot template without {}",
            lambda: hj.zero_shot(dual, ["a", "b"], ["a photo"], tokenize),
            ValueError,
            "templates must contain",
        ),
        (
            "zero-shot class names as one string",
            lambda: hj.zero_shot(dual, "shirt", ["a {}"], tokenize),
            ValueError,
            "class_names must be a list of strings",
        ),
        (
            "zero-shot class named twice",
            lambda: hj.zero_shot(dual, ["a", "b", "a"], ["a {}"], tokenize),
            ValueError,
            "class names must be distinct",
        ),
        (
            "zero-shot on a classifier",
            lambda: hj.zero_shot(bert, ["a", "b"], ["a {}"], tokenize),
            TypeError,
            "takes a CLIP model or a dual encoder",
        ),
        (
            "export a dual encoder's vision tower as a ViT",
            lambda: hj.save_pretrained(hj.vision_tower(dual), Path(tempfile.mkdtemp())),
            hj.ConversionError,
            "belongs to its dual encoder",
        ),
        (
            "vision tower projecting a missing pooler",
            lambda: dataclasses.replace(vision, pooler=False, projection_dim=4),
            ValueError,
            "projects the pooler output",
        ),
        (
            "held-out class that does not exist",
            lambda: zero_shot.seen_classes(config),
            ValueError,
            "held_out names unknown classes ['trousers']",
        ),
        (
            "misclassification detection with no mistakes",
            lambda: metrics.misclassification(np.eye(3), np.arange(3)),
            ValueError,
            "needs right and wrong predictions",
        ),
    ]


def _without_fashion_mnist(tmp: Path) -> object:
    """Reads Fashion-MNIST from a data dir without it, and no installed package to fall back on."""
    installed = image_sources.SYSTEM_FASHION_MNIST
    image_sources.SYSTEM_FASHION_MNIST = tmp / "no_system_package"
    try:
        return image_sources.fashion_mnist(tmp / "empty", "train")
    finally:
        image_sources.SYSTEM_FASHION_MNIST = installed


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _truncated(path: Path):
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    return hj.from_pretrained(path)


def _exploit(tmp: Path):
    import pickle

    class Exploit:
        def __reduce__(self):
            import os

            return (os.system, ("touch pwned",))

    path = tmp / "exploit"
    path.mkdir(exist_ok=True)
    shutil.copy(tmp / "bert" / "config.json", path)
    with zipfile.ZipFile(path / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"w": Exploit()}))
    return hj.from_pretrained(path)


def _conflict(tmp: Path):
    Workdir(tmp / "owned").claim(ml_collections.ConfigDict({"a": 1}))
    Workdir(tmp / "owned").claim(ml_collections.ConfigDict({"a": 2}))


CLI_CASES = [  # (arguments, fragment of the one-line error)
    (
        [
            "train.py",
            "--config=configs/minilm_mr.py:smoke",
            "--workdir={tmp}/w1",
            "--config.train.epochz=3",
        ],
        "unknown config key train.epochz",
    ),
    (
        [
            "train.py",
            "--config=configs/minilm_mr.py:smoke",
            "--workdir={tmp}/w2",
            "--config.train.batch_size=0",
            "--config.data_dir={tmp}/nodata",
        ],
        "train.batch_size must be positive",
    ),
    (
        ["evaluate.py", "--config=configs/minilm_mr.py:smoke", "--workdir={tmp}/w3"],
        "no run of this experiment",
    ),
    (
        ["train.py", "--config=configs/nope.py", "--workdir={tmp}/w4", "--config.x=1"],
        "config file configs/nope.py not found",
    ),
    (
        [
            "train.py",
            "--config=configs/minilm_mr.py:smoke",
            "--workdir={tmp}/w5",
            "--config.mesh.data=4096",
        ],
        "needs 4096 devices",
    ),
    (
        [
            "train.py",
            "--config=configs/minilm_mr.py:smoke",
            "--workdir={tmp}/w6",
            "--config.train.epochs=inf",
        ],
        "train.epochs must be finite",
    ),
]


def run_cli(tmp: Path, args: list[str], fragment: str) -> str:
    command = [sys.executable, *[a.format(tmp=tmp) for a in args]]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    if out.returncode == 0:
        return "silent"
    if out.returncode < 0:
        return "crash"
    clear = fragment in out.stderr and "Traceback" not in out.stderr
    return "clear" if clear else "unclear"


def classify(call: Callable[[], object], kind: type, fragment: str) -> tuple[str, str]:
    """`(outcome, detail)` of one in-process case."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            call()
        except kind as error:
            return ("clear" if fragment in str(error) else "unclear"), str(error)[:150]
        except Exception as error:  # any other error is classified "unclear", not hidden
            return "unclear", f"{type(error).__name__}: {str(error)[:150]}"
    return "silent", "no error"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    jax.config.update("jax_num_cpu_devices", 2)  # devices a 2-process mesh could leave out
    counts = {"clear": 0, "unclear": 0, "silent": 0, "crash": 0}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for label, call, kind, fragment in cases(tmp):
            outcome, detail = classify(call, kind, fragment)
            counts[outcome] += 1
            if args.verbose or outcome != "clear":
                print(f"{outcome:8} {label}: {detail}")
        for cli_args, fragment in CLI_CASES:
            outcome = run_cli(tmp, cli_args, fragment)
            counts[outcome] += 1
            if args.verbose or outcome != "clear":
                print(f"{outcome:8} CLI {' '.join(cli_args[:3])}: {fragment}")
        if (REPO / "pwned").exists() or (tmp / "pwned").exists():
            counts["crash"] += 1
            print("crash    the exploit pickle ran code")
    total = sum(counts.values())
    print(f"{total} bad inputs: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0 if counts["clear"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
