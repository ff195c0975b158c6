"""Head scores, selection, `compact` and ensembles refuse what they cannot mean."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax.data import TokenizedSet
from hydra_jax.heads import keep_mask, score

CASES = [
    pytest.param(
        lambda c: score(c.bert, [c.good], method="magic"),
        ValueError,
        "unknown scoring method",
        id="unknown scoring method",
    ),
    pytest.param(
        lambda c: score(c.bert, None, method="his"),
        ValueError,
        "needs calibration batches",
        id="gradient score without batches",
    ),
    pytest.param(
        lambda c: score(c.bert, [c.good], method="his"),
        ValueError,
        "needs `labels`",
        id="score batches without labels",
    ),
    pytest.param(
        lambda c: score(c.bert, [], method="his"),
        ValueError,
        "no calibration examples",
        id="score an empty iterable",
    ),
    pytest.param(
        lambda c: score(c.bert, [{**c.good, "labels": np.array([0, 7, 1])}], method="his"),
        ValueError,
        "labels must be classes in",
        id="calibration labels outside the classes",
    ),
    pytest.param(
        lambda c: hj.heads.hies(np.ones((2, 4)), np.ones((3, 4)), 0.5),
        ValueError,
        "his and entropy must both be [L, N]",
        id="HIS and entropy of different shapes",
    ),
    pytest.param(
        lambda c: hj.with_classifier(c.bert, 0, jax.random.key(0)),
        ValueError,
        "num_labels must be a positive integer",
        id="a classifier of zero classes",
    ),
    pytest.param(
        lambda c: hj.heads.hies(np.ones((2, 4)), np.ones((2, 4)), 1.5),
        ValueError,
        "alpha must be in [0, 1]",
        id="alpha 1.5",
    ),
    pytest.param(
        lambda c: keep_mask(np.ones((2, 4)), ratio=1.0), ValueError, "pruning ratio", id="ratio 1.0"
    ),
    pytest.param(
        lambda c: keep_mask(np.ones((2, 4)), ratio=-0.1),
        ValueError,
        "pruning ratio",
        id="ratio -0.1",
    ),
    pytest.param(
        lambda c: keep_mask(np.ones((2, 4)), ratio=0.5, keep_per_layer=1),
        ValueError,
        "exactly one",
        id="both ratio and keep",
    ),
    pytest.param(
        lambda c: keep_mask(np.ones((2, 4)), keep_per_layer=0),
        ValueError,
        "keep_per_layer",
        id="keep 0 per layer",
    ),
    pytest.param(
        lambda c: keep_mask(np.full((2, 4), np.nan), ratio=0.5), ValueError, "NaN", id="NaN scores"
    ),
    pytest.param(
        lambda c: keep_mask(np.ones((2, 4)), keep_per_layer=1.5),
        ValueError,
        "keep_per_layer must be an integer",
        id="a fractional keep_per_layer",
    ),
    pytest.param(
        lambda c: hj.heads.compact(c.bert, np.random.default_rng(0).random((2, 4))),
        ValueError,
        "keep mask must be boolean",
        id="scores passed to compact as a keep mask",
    ),
    pytest.param(
        lambda c: hj.ensembles.members_from(c.bert, np.ones((2, 4), bool)),
        ValueError,
        "head_sets must be [M, L, N]",
        id="one head set where members_from wants [M, L, N]",
    ),
    pytest.param(
        lambda c: keep_mask(np.ones((2, 4, 1)), ratio=0.5), ValueError, "[L, N]", id="3-D scores"
    ),
    pytest.param(
        lambda c: hj.heads.compact(c.bert, np.ones((3, 4), bool)),
        ValueError,
        "keep mask has shapes",
        id="compact with wrong keep",
    ),
    pytest.param(
        lambda c: hj.ensembles.stratified_head_sets(np.ones((2, 4)), 0),
        ValueError,
        "num_members must be a positive integer",
        id="a Hydra of zero stratified members",
    ),
    pytest.param(
        lambda c: hj.ensembles.baselines.mc_dropout(c.bert, 0),
        ValueError,
        "samples must be a positive integer",
        id="MC dropout with no samples",
    ),
    pytest.param(
        lambda c: hj.data.labelled_batches(TokenizedSet(list(c.ids), c.labels), 8, 0, 2),
        ValueError,
        "8 calibration examples asked of a set of 3",
        id="more calibration examples than the set has",
    ),
    pytest.param(
        lambda c: hj.data.eval_batches(np.ones(3), 0),
        ValueError,
        "batch_size must be a positive integer",
        id="evaluation batch size 0",
    ),
    pytest.param(
        lambda c: hj.data.subset(TokenizedSet(list(c.ids), c.labels), -1),
        ValueError,
        "subset size must be a non-negative integer",
        id="a negative subset size",
    ),
    pytest.param(
        lambda c: hj.hydra.fuse([c.bert]), ValueError, "at least two members", id="one member"
    ),
    pytest.param(
        lambda c: hj.hydra.fuse(
            [
                hj.heads.compact(c.bert, np.array([[1, 1, 0, 0]] * 2, bool)),
                hj.heads.compact(c.bert, np.array([[1, 0, 0, 0]] * 2, bool)),
            ]
        ),
        ValueError,
        "unequal head counts",
        id="unequal members",
    ),
    pytest.param(
        lambda c: hj.hydra.fuse([c.bert, c.vit]), ValueError, "must all be", id="mixed families"
    ),
    pytest.param(
        lambda c: hj.hydra.stratified_head_sets(np.ones((2, 4)), 3),
        ValueError,
        "do not split evenly",
        id="stratified uneven split",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
