"""Checks each family's tests share: compact == masked, and a fused Hydra == its members."""

from __future__ import annotations

from typing import Any

import numpy as np

import hydra_jax as hj
from hydra_jax.testing import assert_close


def assert_compact_equals_masked(model: hj.Model, inputs: dict[str, Any], keep: np.ndarray):
    """`heads.compact(model, keep)` gives the logits of `model` under `keep` as a head mask."""
    assert_close(hj.heads.compact(model, keep)(**inputs).logits,
                 model(**inputs, head_mask=keep.astype(np.float32)).logits)  # fmt: skip


def assert_fused_equals_members(model: hj.Model, inputs: dict[str, Any], sets: np.ndarray):
    """The fused Hydra of `model`'s members of head sets `sets` `[M, L, N]` gives, at member m,
    member m's own logits."""
    members = hj.hydra.members_from(model, sets)
    logits = np.asarray(hj.hydra.fuse(members)(**inputs).logits)  # [B, M, C]
    for m, member in enumerate(members):
        assert_close(logits[:, m], member(**inputs).logits, err_msg=f"member {m}")
