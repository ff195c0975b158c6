"""Fine-tuning: learning happens, and a killed run resumes to exactly the uninterrupted result."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax.models import BertConfig, EncoderConfig
from hydra_jax.models.model import with_classifier
from hydra_jax.training import TokenizedSet, TrainSettings, fit

CONFIG = BertConfig(
    EncoderConfig((2, 2), 10, 5, 14, "gelu", 1e-12, pre_norm=False, dropout=0.1),
    vocab_size=19, max_positions=20, type_vocab_size=2,
)  # fmt: skip
SETTINGS = TrainSettings(
    epochs=2, batch_size=8, learning_rate=3e-3, warmup_fraction=0.2, checkpoint_every=4, log_every=2
)


@pytest.fixture(scope="module")
def task():
    """Label = whether token 3 occurs: learnable by attention, not by position alone."""
    rng = np.random.default_rng(0)
    tokens, labels = [], []
    for _ in range(50):  # 6 batches of 8 per epoch
        length = rng.integers(3, 12)
        t = rng.integers(4, 19, length)
        label = rng.integers(0, 2)
        if label:
            t[rng.integers(1, length)] = 3
        tokens.append(np.r_[1, t, 2].astype(np.int32))
        labels.append(label)
    model = with_classifier(hj.Model.init(CONFIG, jax.random.key(0)), 2, jax.random.key(1))
    return model, TokenizedSet(tokens, np.array(labels))


def test_killed_run_resumes_to_the_uninterrupted_result(task, tmp_path):
    model, data = task
    straight = fit(model, data, SETTINGS, tmp_path / "straight")
    # Killed after 6 steps; the last checkpoint is step 4, so 2 steps are lost and redone.
    fit(model, data, SETTINGS, tmp_path / "resumed", stop_after=6)
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == ["4"]
    resumed = fit(model, data, SETTINGS, tmp_path / "resumed")
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(a, b)
    # The input model is untouched (the train step donates a copy, not the caller's weights).
    assert not np.array_equal(
        model.params["classifier"]["kernel"], straight.params["classifier"]["kernel"]
    )
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12]
    assert records[-1]["loss"] < records[0]["loss"]


def test_too_few_examples_for_a_batch(task, tmp_path):
    model, data = task
    small = TokenizedSet(data.tokens[:5], data.labels[:5])
    with pytest.raises(ValueError, match="5 training examples do not fill one batch of 8"):
        fit(model, small, SETTINGS, tmp_path)
