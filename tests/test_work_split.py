"""Every program divides its work over the mesh: per-device FLOPs (XLA's cost analysis of the
compiled program) times the device count, over the one-device program's, within 1.10, for the
forward pass (`Model.apply` under a plain `jax.jit`) and the training step (`make_train_step`)
of every kind, at data=8 and at data=4 x member=2. Equal results do not show this: a program
that computes the whole batch on every device gives the same numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import hydra_jax as hj
from hydra_jax import hydra, testing
from hydra_jax.ensembles import baselines
from hydra_jax.heads import circuit, scoring
from hydra_jax.models.sharding import abstract_params, make_mesh
from hydra_jax.training import TrainSettings, TrainState, make_optimizer, make_train_step, mimo_loss

pytestmark = pytest.mark.slow  # about forty compilations

L, N, K, F, B, M = 1, 4, 16, 128, 64, 4  # activations outweigh the replicated optimiser update
VIT = testing.vit(layers=L, heads=N, head_dim=K, mlp_dim=F, image_size=32, patch_size=8,
                  num_labels=5)  # fmt: skip
TEXT = testing.bert(layers=L, heads=N, head_dim=K, mlp_dim=F, vocab_size=40, max_positions=24,
                    num_labels=3)  # fmt: skip
MESHES = {"data=8": (8, 1, 1), "data=4 x member=2": (4, 2, 1)}
LIMIT = 1.10


def member_sets(heads: int) -> np.ndarray:
    """M head sets `[M, L, N]` of N // 2 heads each, overlapping."""
    keep = np.zeros((M, L, heads), bool)
    for m in range(M):
        keep[m, :, (np.arange(heads // 2) + m) % heads] = True
    return keep


KINDS = ("single", "hydra", "text_hydra", "deep_ensemble", "batch_ensemble", "lora_ensemble",
         "packed_ensemble", "mimo")  # fmt: skip


@pytest.fixture(scope="module")
def models() -> dict[str, tuple[hj.Model, bool]]:
    """Every kind of `KINDS`: `(model, stacked)`; a stacked Deep Ensemble runs
    `baselines.deep_ensemble`. Built once, when the first test asks (not at collection)."""
    vit = hj.Model.init(VIT, jax.random.key(0))
    text = hj.Model.init(TEXT, jax.random.key(1))
    built = {
        "single": (vit, False),
        "hydra": (hydra.fuse(hydra.members_from(vit, member_sets(N))), False),
        "text_hydra": (hydra.fuse(hydra.members_from(text, member_sets(N))), False),
        "deep_ensemble": (vit, True),
        "batch_ensemble": (hydra.batch_ensemble(vit, M, jax.random.key(2)), False),
        "lora_ensemble": (hydra.lora_ensemble(vit, M, jax.random.key(3), rank=4), False),
        "packed_ensemble": (hydra.packed_ensemble(VIT, M, jax.random.key(4), 2, 2), False),
        "mimo": (hydra.mimo(VIT, M, jax.random.key(5)), False),
    }
    assert tuple(built) == KINDS
    return built


def batch(model: hj.Model, mesh) -> dict[str, jax.ShapeDtypeStruct]:
    rows = None if mesh is None else NamedSharding(mesh, P("data"))
    if "pixel_values" in hj.models.architectures.input_names(model.config):
        inputs = {"pixel_values": jax.ShapeDtypeStruct((B, 3, 32, 32), jnp.float32, sharding=rows)}
    else:
        inputs = {
            name: jax.ShapeDtypeStruct((B, 20), jnp.int32, sharding=rows)
            for name in ("input_ids", "attention_mask")
        }
    return inputs | {"labels": jax.ShapeDtypeStruct((B,), jnp.int32, sharding=rows)}


def flops(compiled) -> float:
    analysis = compiled.cost_analysis()
    return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]


def work(name: str, model: hj.Model, stacked: bool, mesh) -> dict[str, float]:
    """Per-device FLOPs of each program of `model`, compiled for `mesh` (None: one device)."""
    inputs = batch(model, mesh)
    features = {k: v for k, v in inputs.items() if k != "labels"}
    if stacked:
        forward = jax.jit(baselines.deep_ensemble(model))
        weights = abstract_params(baselines.stack([model] * M), mesh, stacked=True)
        return {"forward": flops(forward.lower(weights, features).compile())}
    forward = jax.jit(lambda p, x: model.apply(p, **x).logits)
    out = {"forward": flops(forward.lower(abstract_params(model.params, mesh), features).compile())}
    optimizer = make_optimizer(TrainSettings(), 100)
    loss = mimo_loss(model, 2, 0.5) if name == "mimo" else None
    step = make_train_step(model, optimizer, loss)
    state = jax.eval_shape(lambda p: TrainState.create(p, optimizer), model.params)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    weights = abstract_params(state, mesh)
    compiled = step.single.lower(weights, inputs, key).compile()
    if mesh is not None:  # the step returns the state laid out as it took it
        placed = jax.tree.map(lambda w: w.sharding, weights)
        returned = compiled.output_shardings[0]
        assert jax.tree.all(jax.tree.map(lambda a, b: a.is_equivalent_to(b, 2), placed, returned))
    out["train_step"] = flops(compiled)
    return out


def assert_divides(programs, name: str = "") -> None:
    """`programs(mesh)` (per-device FLOPs by program; None: one device) within `LIMIT` of an
    even split on each mesh of `MESHES`."""
    one = programs(None)
    for label, shape in MESHES.items():
        mesh = make_mesh(*shape)
        with jax.set_mesh(mesh):
            split = {k: v * mesh.size / one[k] for k, v in programs(mesh).items()}
        assert all(s <= LIMIT for s in split.values()), (name, label, split)


@pytest.mark.parametrize("name", KINDS)
def test_every_program_divides_its_work_over_the_mesh(models, name):
    model, stacked = models[name]
    assert_divides(lambda mesh: work(name, model, stacked, mesh), name)


def test_head_scores_and_mc_dropout_divide_their_work():
    """The per-example gradients of the head scores (HIS and attention entropy), split as a
    batch is, and MC dropout's samples of one model, folded over `member` too."""
    model = hj.Model.init(VIT, jax.random.key(6))
    stats = scoring._head_stats(model.config, True)
    mc = jax.jit(baselines.mc_dropout(model, 4))

    def programs(mesh) -> dict[str, float]:
        inputs = batch(model, mesh)
        weights = abstract_params(model.params, mesh)
        pixels = {"pixel_values": inputs["pixel_values"]}
        return {
            "scores": flops(stats.lower(weights, inputs).compile()),
            "mc_dropout": flops(mc.lower(weights, pixels).compile()),
        }

    assert_divides(programs)


def test_circuit_search_divides_its_work():
    """Circuit search's two programs (a layer's advance, the suffix's logits), with their
    outputs split by rows."""
    model = hj.Model.init(VIT, jax.random.key(7))
    search = circuit.CircuitSearch(model)
    L = VIT.encoder.num_layers

    def programs(mesh) -> dict[str, float]:
        pixels = {"pixel_values": batch(model, mesh)["pixel_values"]}
        weights = abstract_params(model.params, mesh)
        mask = jax.ShapeDtypeStruct((L, N), jnp.float32)
        advance = search._advance.lower(weights, pixels, None, mask, l=0).compile()
        suffix = search._suffix.lower(weights, pixels, None, mask, l=0).compile()
        if mesh is not None:
            assert suffix.output_shardings.spec[0] in ("data", ("data", "member")), suffix
        return {"advance": flops(advance), "suffix": flops(suffix)}

    assert_divides(programs)
