"""Model inputs refused outside `jit`: ids, masks, images, head masks, compute dtypes."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hydra_jax as hj

CASES = [
    pytest.param(
        lambda c: c.bert(**{**c.good, "input_ids": c.ids + 49}),
        ValueError,
        "[0, 50)",
        id="id >= vocab",
    ),
    pytest.param(
        lambda c: c.bert(**{**c.good, "input_ids": c.ids * 0 - 1}), ValueError, "-1 at", id="id -1"
    ),
    pytest.param(
        lambda c: c.bert(**{**c.good, "input_ids": c.ids + 0.0}),
        ValueError,
        "must be integers",
        id="float ids",
    ),
    pytest.param(lambda c: c.bert(input_ids=c.ids[0]), ValueError, "[B, T]", id="1-D ids"),
    pytest.param(
        lambda c: c.bert(input_ids=np.ones((1, 13), np.int32)),
        ValueError,
        "more than the model's 12 positions",
        id="too many tokens",
    ),
    pytest.param(
        lambda c: c.bert(**c.good, token_type_ids=c.ids * 0 + 2),
        ValueError,
        "[0, 2)",
        id="token type 2",
    ),
    pytest.param(
        lambda c: c.bert(input_ids=c.ids, attention_mask=c.mask[:, :3]),
        ValueError,
        "attention_mask has shape",
        id="mask of another shape",
    ),
    pytest.param(
        lambda c: c.bert(input_ids=c.ids, attention_mask=c.mask * np.array([[1], [0], [1]])),
        ValueError,
        "all padding",
        id="all-padding example",
    ),
    pytest.param(
        lambda c: c.bert(input_ids=np.zeros((0, 4), np.int32)),
        ValueError,
        "empty batch",
        id="empty batch",
    ),
    pytest.param(
        lambda c: c.bert(**c.good, pixel_values=c.pixels),
        TypeError,
        "unexpected inputs",
        id="pixels to a text model",
    ),
    pytest.param(
        lambda c: c.vit(pixel_values=c.pixels.transpose(0, 2, 3, 1)),
        ValueError,
        "channels last (NHWC)",
        id="NHWC pixels",
    ),
    pytest.param(
        lambda c: c.vit(pixel_values=c.pixels[:, :, :4, :4]),
        ValueError,
        "[B, C, H, W]",
        id="wrong image size",
    ),
    pytest.param(
        lambda c: c.vit(pixel_values=c.pixels[:, :1]),
        ValueError,
        "[B, C, H, W]",
        id="wrong channel count",
    ),
    pytest.param(
        lambda c: c.clip(input_ids=np.full((1, 4), 30)),
        ValueError,
        "[0, 30)",
        id="CLIP id >= vocab",
    ),
    pytest.param(
        lambda c: c.bert(**c.good, head_mask=np.ones((4, 2))),
        ValueError,
        "head_mask has shape",
        id="head mask transposed",
    ),
    pytest.param(
        lambda c: c.bert(**c.good, head_mask=np.ones(8)),
        ValueError,
        "head_mask has shape",
        id="head mask flat",
    ),
    pytest.param(
        lambda c: c.bert(**c.good, head_mask=np.full((2, 4), np.nan)),
        ValueError,
        "head_mask contains NaN/inf",
        id="NaN head mask",
    ),
    pytest.param(
        lambda c: c.clip(input_ids=c.ids % 29, head_mask=np.ones((1, 2))),
        TypeError,
        "unexpected inputs",
        id="CLIP head mask name",
    ),
    pytest.param(
        lambda c: hj.models.EncoderConfig((2,), 4, 2, 6, "gelu", 1e-12, False, dtype="float16"),
        ValueError,
        "compute dtype 'float16' is not one of",
        id="compute dtype float16",
    ),
    pytest.param(
        lambda c: hj.with_dtype(c.bert, "int8"),
        ValueError,
        "compute dtype 'int8' is not one of",
        id="with_dtype int8",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
