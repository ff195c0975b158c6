"""Fused Hydra == its members; member strategies; circuit search == a naive reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import hydra
from hydra_jax.heads.circuit import UncertaintySet, circuit_search, harm
from hydra_jax.models import BertConfig, EncoderConfig
from hydra_jax.models.model import with_classifier
from hydra_jax.training import TokenizedSet

L, N, K, M = 3, 6, 4, 3
CONFIG = BertConfig(
    EncoderConfig((N,) * L, N * K, K, 26, "gelu", 1e-12, pre_norm=False, dropout=0.1),
    vocab_size=37, max_positions=16, type_vocab_size=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def base():
    model = with_classifier(hj.Model.init(CONFIG, jax.random.key(0)), 2, jax.random.key(1))
    params = jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, model.params)  # distinct heads
    rng = np.random.default_rng(0)
    mask = (np.arange(10)[None] < rng.integers(2, 11, (7, 1))).astype(np.int32)
    batch = dict(input_ids=rng.integers(1, 37, (7, 10)) * mask, attention_mask=mask,
                 labels=rng.integers(0, 2, 7))  # fmt: skip
    return hj.Model(model.config, params), batch


@pytest.fixture(scope="module")
def head_sets():
    return hydra.stratified_head_sets(np.random.default_rng(1).random((L, N)), M)


def test_stratified_sets_are_disjoint_equal_and_cover_every_head(head_sets):
    assert head_sets.shape == (M, L, N)
    np.testing.assert_array_equal(head_sets.sum(0), np.ones((L, N)))  # each head in one member
    np.testing.assert_array_equal(head_sets.sum(-1), np.full((M, L), N // M))
    scores = np.arange(12.0).reshape(2, 6)
    sets = hydra.stratified_head_sets(scores, 3)
    np.testing.assert_array_equal(np.nonzero(sets[0, 0])[0], [2, 5])  # ranks 0 and 3


def test_fused_equals_members_run_alone(base, head_sets):
    model, batch = base
    members = hydra.members_from(model, head_sets)
    fused = hydra.fuse(members)
    logits = fused(**batch).logits
    assert logits.shape == (7, M, 2)
    for m, member in enumerate(members):
        np.testing.assert_allclose(logits[:, m], member(**batch).logits, atol=1e-5)
        masked = model(**batch, head_mask=head_sets[m].astype(np.float32)).logits
        np.testing.assert_allclose(logits[:, m], masked, atol=1e-5)


def test_fused_fine_tuned_members_equal_members_with_averaged_mlp(base, head_sets):
    model, batch = base
    rng = np.random.default_rng(2)
    members = [
        hj.Model(m.config, jax.tree.map(lambda x: x + 0.05 * rng.normal(size=x.shape), m.params))
        for m in hydra.members_from(model, head_sets)
    ]  # as if fine-tuned separately: every weight differs, MLPs and embeddings included
    logits = hydra.fuse(members)(**batch).logits
    for m, member in enumerate(hydra.with_shared_weights(members)):
        np.testing.assert_allclose(logits[:, m], member(**batch).logits, atol=1e-5)
    # Not the members as they were: the MLP average matters.
    assert not np.allclose(logits[:, 0], members[0](**batch).logits, atol=1e-3)


def test_fuse_refuses_unequal_members(base, head_sets):
    model, _ = base
    uneven = head_sets.copy()
    uneven[1, 2, np.argmin(uneven[1, 2])] = True  # member 1 keeps one more head in layer 2
    with pytest.raises(
        ValueError,
        match=r"unequal head counts per layer: member 0: \[2, 2, 2\]; member 1: \[2, 2, 3\]",
    ):
        hydra.fuse(hydra.members_from(model, uneven))
    with pytest.raises(ValueError, match="at least two members"):
        hydra.fuse(hydra.members_from(model, head_sets[:1]))


def test_fused_model_saves_and_restores_with_orbax(base, head_sets, tmp_path):
    model, batch = base
    fused = hydra.fuse(hydra.members_from(model, head_sets))
    hydra.save(fused, tmp_path / "hydra")
    restored = hydra.load(tmp_path / "hydra")
    assert restored.config == fused.config
    np.testing.assert_array_equal(restored(**batch).logits, fused(**batch).logits)


def test_dropout_runs_per_member(base, head_sets):
    model, batch = base
    fused = hydra.fuse(hydra.members_from(model, head_sets))
    a = fused.apply(fused.params, **batch, dropout_rng=jax.random.key(0)).logits
    b = fused.apply(fused.params, **batch, dropout_rng=jax.random.key(1)).logits
    assert a.shape == (7, M, 2) and not np.allclose(a, b)


def test_taylor_and_hies_member_sets(base):
    model, batch = base
    halves = [[{k: v[:4] for k, v in batch.items()}], [{k: v[3:] for k, v in batch.items()}]]
    taylor = hydra.taylor_head_sets(model, halves, keep_per_layer=2)
    assert taylor.shape == (2, L, N) and np.all(taylor.sum(-1) == 2)
    sets = hydra.hies_head_sets(model, [batch], alphas=(0.0, 1.0), keep_per_layer=2)
    assert np.all(sets.sum(-1) == 2) and not np.array_equal(sets[0], sets[1])


# ----------------------------------------------------------------------------- circuit


@pytest.fixture(scope="module")
def uncertainty_set():
    rng = np.random.default_rng(3)

    def tokens(n, low, high):
        return [
            np.r_[1, rng.integers(low, high, rng.integers(2, 9)), 2].astype(np.int32)
            for _ in range(n)
        ]

    id_set = TokenizedSet(tokens(14, 3, 20), rng.integers(0, 2, 14))
    ood_set = TokenizedSet(tokens(10, 20, 37), np.zeros(10, np.int64))
    return UncertaintySet.build(id_set, ood_set, batch_size=8)


def naive_circuit(model, data, n, objective):
    """The definition, one full forward per candidate."""
    keep = np.ones((L, N), bool)
    for l in range(L):
        logits = []
        for h in range(N):
            mask = keep.astype(np.float32)
            mask[l, h] = 0.0
            logits.append(
                np.concatenate(
                    [
                        np.asarray(
                            model(
                                **{k: v for k, v in b.items() if k != "labels"}, head_mask=mask
                            ).logits
                        )
                        for b in data.batches
                    ]
                )
            )
        scores = harm(objective, np.stack(logits), data)
        keep[l] = False
        keep[l, np.argsort(-scores, kind="stable")[:n]] = True
    return keep


@pytest.mark.parametrize("objective", ["nll", "auroc", "avg"])
def test_circuit_search_equals_naive_reference(base, uncertainty_set, objective):
    model, _ = base
    keep = circuit_search(model, uncertainty_set, keep_per_layer=2, objective=objective)
    assert keep.shape == (L, N) and np.all(keep.sum(1) == 2)
    np.testing.assert_array_equal(keep, naive_circuit(model, uncertainty_set, 2, objective))


def test_circuit_objectives_differ(base, uncertainty_set):
    model, _ = base
    sets = {o: circuit_search(model, uncertainty_set, 2, o) for o in ("nll", "auroc")}
    assert not np.array_equal(sets["nll"], sets["auroc"])


def test_harm_semantics():
    data = UncertaintySet(
        batches=[], is_ood=np.array([False, False, True, True]), labels=np.array([0, 1, 0, 0])
    )
    confident_right = np.array([[4.0, -4.0], [-4.0, 4.0], [0.1, 0.0], [0.0, 0.1]])  # OOD unsure
    wrong = -confident_right
    logits = np.stack([confident_right, wrong])  # [H=2, V=4, C=2]
    nll = harm("nll", logits, data)
    assert nll[1] > nll[0]  # masking that makes ID predictions wrong hurts more
    auroc_harm = harm("auroc", logits, data)
    assert auroc_harm[0] == pytest.approx(-1.0)  # OOD perfectly flagged: AUROC 1
    # Both candidates flag OOD perfectly (confidently wrong is still confident): the AUROC term
    # is constant, min-maxes to 0, and only the NLL term separates them.
    np.testing.assert_allclose(harm("avg", logits, data), [0.0, 0.5])
