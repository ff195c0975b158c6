"""Dual encoders and zero-shot classifiers refuse malformed prompts, classes and exports."""

from __future__ import annotations

import dataclasses
import re

import jax
import ml_collections
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import metrics
from hydra_jax.data.files import ClassNames, DataError
from hydra_jax.experiments import study_inputs
from hydra_jax.models import DualEncoderConfig


@pytest.fixture(scope="module")
def c(c):
    """The shared context with a dual encoder of its tiny ViT and BERT, and a tokenizer."""
    c.vision = dataclasses.replace(c.vit.config, num_labels=0)
    c.text = dataclasses.replace(c.bert.config, num_labels=0)
    c.dual = hj.Model.init(DualEncoderConfig(c.vision, c.text, 5), jax.random.key(4))
    c.tokenize = lambda texts: {"input_ids": np.ones((len(texts), 3), np.int32)}
    c.config = ml_collections.ConfigDict({"zero_shot": {"held_out": ("trousers",)}})
    names = ClassNames(("shirt", "trouser"))
    c.classes = study_inputs.Data(None, 2, lambda: None, lambda: None, names)
    return c


CASES = [
    pytest.param(
        lambda c: hj.zero_shot(c.dual, ["a", "b"], ["a photo"], c.tokenize),
        ValueError,
        "templates must contain",
        id="zero-shot template without {}",
    ),
    pytest.param(
        lambda c: hj.zero_shot(c.dual, "shirt", ["a {}"], c.tokenize),
        ValueError,
        "class_names must be a list of strings",
        id="zero-shot class names as one string",
    ),
    pytest.param(
        lambda c: hj.zero_shot(c.dual, ["a", "b", "a"], ["a {}"], c.tokenize),
        ValueError,
        "class names must be distinct",
        id="zero-shot class named twice",
    ),
    pytest.param(
        lambda c: hj.zero_shot(c.bert, ["a", "b"], ["a {}"], c.tokenize),
        TypeError,
        "takes a CLIP model or a dual encoder",
        id="zero-shot on a classifier",
    ),
    pytest.param(
        lambda c: hj.save_pretrained(hj.vision_tower(c.dual), c.tmp / "tower"),
        hj.ConversionError,
        "belongs to its dual encoder",
        id="export a dual encoder's vision tower as a ViT",
    ),
    pytest.param(
        lambda c: dataclasses.replace(c.vision, pooler=False, projection_dim=4),
        ValueError,
        "projects the pooler output",
        id="vision tower projecting a missing pooler",
    ),
    pytest.param(
        lambda c: study_inputs.held_out(c.config, c.classes),
        DataError,
        "zero_shot.held_out names unknown classes ['trousers']; classes: ['shirt', 'trouser']",
        id="held-out class that does not exist",
    ),
    pytest.param(
        lambda c: metrics.misclassification(np.eye(3), np.arange(3)),
        ValueError,
        "needs right and wrong predictions",
        id="misclassification detection with no mistakes",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
