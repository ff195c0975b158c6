"""Every architecture of the table refuses bad input the same way, before any computation: the
checks come from its `Architecture` entry, so a model is built with no weights at all (the
refusal comes first). A new entry without a row here fails `test_every_architecture_is_here`."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.models import (
    ARCHITECTURES,
    BertConfig,
    CLIPClassifierConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    CLIPVisionTowerConfig,
    DualEncoderConfig,
    ModernBertConfig,
    RelativeAttention,
    SiglipClassifierConfig,
    SiglipConfig,
    SiglipTextConfig,
    SiglipVisionConfig,
    SiglipVisionTowerConfig,
    ViTConfig,
)

V, S, C = 30, 12, 3  # vocabulary, image size, channels
PRE = testing.encoder(layers=1, heads=2, head_dim=4, mlp_dim=10, layer_norm_eps=1e-6, pre_norm=True)
POST = testing.encoder(layers=1, heads=2, head_dim=4, mlp_dim=10)
VIT = ViTConfig(PRE, S, 4, C, num_labels=2)
CLIP_VISION = CLIPVisionConfig(PRE, S, 4, C)
SIGLIP_VISION = SiglipVisionConfig(PRE, S, 4, C)
MODELS = {
    "bert": BertConfig(POST, V, 16, 2, num_labels=2),
    "deberta": BertConfig(
        dataclasses.replace(POST, relative=RelativeAttention(4, 4, 16)), V, 16, 0,
        pooler=False, num_labels=2, model_type="deberta-v2", absolute_positions=False,
    ),
    "modernbert": ModernBertConfig(PRE, V, 16, num_labels=2),
    "vit": VIT,
    "clip_tower": CLIPVisionTowerConfig(CLIP_VISION, 6, num_labels=2),
    "clip_classifier": CLIPClassifierConfig(CLIP_VISION, num_labels=2),
    "siglip_tower": SiglipVisionTowerConfig(SIGLIP_VISION, num_labels=2),
    "siglip_classifier": SiglipClassifierConfig(SIGLIP_VISION, num_labels=2),
    "clip": CLIPConfig(CLIPTextConfig(PRE, V, 16, 2), CLIP_VISION, 6),
    "siglip": SiglipConfig(SiglipTextConfig(PRE, V, 16, 8), SIGLIP_VISION),
    "dual": DualEncoderConfig(ViTConfig(PRE, S, 4, C), BertConfig(POST, V, 16, 2), 6),
}  # fmt: skip


def test_every_architecture_is_here():
    assert {type(c) for c in MODELS.values()} == set(ARCHITECTURES)


def good(config) -> dict[str, np.ndarray]:
    names = hj.models.input_names(config)
    batch = {}
    if "input_ids" in names:
        batch["input_ids"] = np.full((2, 5), 3, np.int32)
        batch["attention_mask"] = np.ones((2, 5), np.int32)
    if "pixel_values" in names:
        batch["pixel_values"] = np.zeros((2, C, S, S), np.float32)
    return batch


TEXT_CASES = {
    "id beyond the vocabulary": (lambda b: {**b, "input_ids": b["input_ids"] + V},
                                 r"input_ids must lie in \[0, 30\) \(the vocabulary\)"),
    "no tokens": (lambda b: {**b, "input_ids": b["input_ids"][:, :0],
                             "attention_mask": b["attention_mask"][:, :0]}, "has no tokens"),
    "a mask of 2s": (lambda b: {**b, "attention_mask": 2 * b["attention_mask"]},
                     r"attention_mask must be 0 \(padding\) or 1"),
    "all padding": (lambda b: {**b, "attention_mask": 0 * b["attention_mask"]},
                    r"examples \[0, 1\] of the batch are all padding"),
}  # fmt: skip
IMAGE_CASES = {
    "raw bytes": (lambda b: {**b, "pixel_values": b["pixel_values"].astype(np.uint8)},
                  "pixel_values are uint8"),
    "not finite": (lambda b: {**b, "pixel_values": b["pixel_values"] + np.nan},
                   "pixel_values contain NaN/inf"),
    "channels last": (lambda b: {**b, "pixel_values": b["pixel_values"].transpose(0, 2, 3, 1)},
                      r"channels last \(NHWC\)"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MODELS))
def test_every_architecture_refuses_bad_input_before_computing(name):
    config = MODELS[name]
    model = hj.Model(config, {})  # no weights: each refusal comes before any computation
    batch = good(config)
    cases = {**(TEXT_CASES if "input_ids" in batch else {}),
             **(IMAGE_CASES if "pixel_values" in batch else {})}  # fmt: skip
    first = next(iter(batch))
    cases["empty batch"] = (lambda b: {**b, first: b[first][:0]}, "empty batch")
    wrong = []
    for case, (change, message) in cases.items():
        try:
            model(**change(batch))
            wrong.append(f"{case}: accepted")
        except Exception as error:  # a missing check reaches the (absent) weights instead
            if not (isinstance(error, ValueError) and re.search(message, str(error))):
                wrong.append(f"{case}: {type(error).__name__}: {str(error)[:120]}")
    assert not wrong, wrong
