"""Rematerialised layers (`with_remat`): every kind's gradients are the plain model's, with
dropout on, the gradient program holds one rematerialised block per layer, and the compiled
training step recomputes them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import hydra, testing
from hydra_jax.training import (
    TrainSettings,
    TrainState,
    classification_loss,
    make_optimizer,
    make_train_step,
    mimo_loss,
)

L, N, M = 2, 4, 3
VIT = testing.vit(layers=L, heads=N, head_dim=3, mlp_dim=12, image_size=8, patch_size=4,
                  num_labels=3, dropout=0.1, attention_dropout=0.1)  # fmt: skip
TEXT = testing.bert(layers=L, heads=N, head_dim=3, mlp_dim=10, vocab_size=30, max_positions=12,
                    num_labels=3, dropout=0.1)  # fmt: skip


@functools.cache
def kinds() -> dict[str, hj.Model]:
    vit = hj.Model.init(VIT, jax.random.key(0))
    keep = np.zeros((M, L, N), bool)
    for m in range(M):
        keep[m, :, [m % N, (m + 1) % N]] = True
    return {
        "single": vit,
        "text": hj.Model.init(TEXT, jax.random.key(1)),
        "hydra": hydra.fuse(hydra.members_from(vit, keep)),
        "batch_ensemble": hydra.batch_ensemble(vit, M, jax.random.key(2)),
        "lora_ensemble": hydra.lora_ensemble(vit, M, jax.random.key(3), rank=2),
        "packed_ensemble": hydra.packed_ensemble(VIT, M, jax.random.key(4), 2, 2),
        "mimo": hydra.mimo(VIT, M, jax.random.key(5)),
    }


def batch(model: hj.Model, rows: int = 4) -> dict[str, jax.Array]:
    if "pixel_values" in hj.models.architectures.input_names(model.config):
        inputs = {"pixel_values": jax.random.normal(jax.random.key(7), (rows, 3, 8, 8))}
    else:
        ids = jax.random.randint(jax.random.key(8), (rows, 10), 1, 30)
        inputs = {"input_ids": ids, "attention_mask": jnp.ones_like(ids)}
    return inputs | {"labels": jnp.arange(rows) % 3}


@pytest.mark.parametrize(
    "name",
    ["single", "text", "hydra", "batch_ensemble", "lora_ensemble", "packed_ensemble", "mimo"],
)
def test_rematerialised_gradients_are_the_models(name):
    model = kinds()[name]
    remat = hj.with_remat(model)
    inputs = batch(model)

    def gradient(m: hj.Model):
        fn = mimo_loss(m, 2, 0.5) if name == "mimo" else classification_loss(m)
        return jax.grad(lambda p: fn(p, inputs, jax.random.key(9))[0])

    rematerialised = jax.jit(gradient(remat)).trace(model.params)  # traced once: read, then run
    plain = jax.jit(gradient(model)).trace(model.params)
    assert str(rematerialised.jaxpr).count("remat") >= L
    assert "remat" not in str(plain.jaxpr)
    jax.tree.map(
        testing.assert_close,
        rematerialised.lower().compile()(model.params),
        plain.lower().compile()(model.params),
    )


def test_a_rematerialised_training_step_recomputes_its_layers():
    """XLA keeps the recomputation (it is not merged back into the forward pass): the compiled
    step does more work. Its memory effect shows on a TPU compile (`hydra-jax plan`, whose
    rows for the paper's ViT-B/16 docs/scale.md gives), not in XLA:CPU's memory analysis."""
    model = kinds()["hydra"]
    optimizer = make_optimizer(TrainSettings(), 10)
    state = TrainState.create(model.params, optimizer)
    inputs = batch(model)

    def flops(m: hj.Model) -> float:
        compiled = make_train_step(m, optimizer).single.lower(state, inputs, jax.random.key(0))
        return compiled.compile().cost_analysis()["flops"]

    assert flops(hj.with_remat(model)) > 1.1 * flops(model)
