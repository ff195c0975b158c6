"""Checks each family's tests share: compact == masked, a fused Hydra == its members, the
circuit search's definition run naively, and the MSP scores of a workdir's saved predictions
read from the arrays alone (the reference `hydra-jax compare`'s draws are checked against)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from compiled import run

import hydra_jax as hj
from hydra_jax import metrics
from hydra_jax.heads import harm
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


def naive_circuit(model, data, n, objective):
    """The definition, one full forward per candidate (one compiled program, masks as inputs)."""
    L, heads = model.config.encoder.num_layers, model.config.encoder.num_heads[0]
    inputs = [{k: v for k, v in b.items() if k != "labels"} for b in data.batches]
    keep = np.ones((L, heads), bool)
    for l in range(L):
        logits = []
        for h in range(heads):
            mask = keep.astype(np.float32)
            mask[l, h] = 0.0
            logits.append(
                np.concatenate([np.asarray(run(model, **b, head_mask=mask).logits) for b in inputs])
            )
        scores = harm(objective, np.stack(logits), data)
        keep[l] = False
        keep[l, np.argsort(-scores, kind="stable")[:n]] = True
    return keep


def saved_msp_run(workdir: Path, a: str, b: str) -> tuple:
    """`(id_a, ood_a, id_b, ood_b)` for `metrics.pooled_auroc_difference`: the MSP scores of
    methods `a` and `b` on the ID test set and on each OOD set by name, read from the keys of
    `predictions/NAME.npz` alone."""

    def msp(method: str) -> tuple:
        with np.load(workdir / "predictions" / f"{method}.npz") as npz:
            p = dict(npz)
        names = sorted(k[4:-6] for k in p if k.startswith("ood_") and k.endswith("_probs"))
        return metrics.ood_score(p["id_probs"]), [metrics.ood_score(p[f"ood_{n}_probs"])
                                                  for n in names]  # fmt: skip

    return (*msp(a), *msp(b))
