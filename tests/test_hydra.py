"""Fused Hydra == its members for every family; member strategies; circuit search == a naive
reference (BERT, a CLIP vision tower and a dual encoder's zero-shot ViT tower)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from compiled import run
from equivalences import naive_circuit

import hydra_jax as hj
from hydra_jax import hydra, testing
from hydra_jax.data import TokenizedSet, uncertainty_batches
from hydra_jax.heads import CircuitSearch, UncertaintyBatches, circuit_search, harm
from hydra_jax.models import (
    BertConfig,
    CLIPVisionConfig,
    CLIPVisionTowerConfig,
    with_classifier,
)
from hydra_jax.testing import assert_close

L, N, K, M = 4, 6, 5, 3  # distinct: a swapped axis fails; n = N // M = 2 heads per member
CONFIG = BertConfig(
    testing.encoder(layers=L, heads=N, head_dim=K, mlp_dim=26, dropout=0.1),
    vocab_size=37, max_positions=16, type_vocab_size=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def base():
    model = testing.sharpened(with_classifier(hj.Model.init(CONFIG, jax.random.key(0)), 2,
                                      jax.random.key(1)))  # fmt: skip
    rng = np.random.default_rng(0)
    mask = (np.arange(10)[None] < rng.integers(2, 11, (7, 1))).astype(np.int32)
    batch = dict(input_ids=rng.integers(1, 37, (7, 10)) * mask, attention_mask=mask,
                 labels=rng.integers(0, 2, 7))  # fmt: skip
    return model, batch


@pytest.fixture(scope="module")
def vision_models():
    """A ViT classifier (pre-LN, pooler), a CLIP vision tower with a zero-shot head and a
    ViT-BERT dual encoder's vision tower with a zero-shot head, each of 2 layers (L != M != N
    here too)."""
    vit = testing.vit(layers=2, heads=N, head_dim=3, mlp_dim=13, layer_norm_eps=1e-6,
                      num_channels=2, num_labels=5)  # fmt: skip
    tower_stack = testing.encoder(
        layers=2, heads=N, head_dim=2, mlp_dim=11, activation="quick_gelu", layer_norm_eps=1e-5,
        pre_norm=True,
    )  # fmt: skip
    tower = CLIPVisionTowerConfig(CLIPVisionConfig(tower_stack, 6, 3, num_channels=3),
                                  projection_dim=7)  # fmt: skip
    dual = hj.models.DualEncoderConfig(
        testing.vit(layers=2, heads=N, head_dim=2, mlp_dim=9, image_size=6, patch_size=3,
                    num_channels=1),
        testing.bert(layers=1, heads=2, head_dim=2, mlp_dim=6, vocab_size=11, max_positions=8),
        projection_dim=5,
    )  # fmt: skip
    rng = np.random.default_rng(5)
    dual_tower = hj.vision_tower(hj.Model.init(dual, jax.random.key(6)))
    return {
        "vit": (
            testing.sharpened(hj.Model.init(vit, jax.random.key(2)), 3.0),
            {"pixel_values": rng.normal(size=(5, 2, 8, 8)).astype(np.float32)},
        ),
        "tower": (
            testing.sharpened(with_classifier(hj.Model.init(tower, jax.random.key(3)), 4,
                                      jax.random.key(4)), 3.0),
            {"pixel_values": rng.normal(size=(5, 3, 6, 6)).astype(np.float32)},
        ),
        "dual_tower": (
            testing.sharpened(with_classifier(dual_tower, 4, jax.random.key(7)), 3.0),
            {"pixel_values": rng.normal(size=(5, 1, 6, 6)).astype(np.float32)},
        ),
    }  # fmt: skip


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
    from_generator = hydra.fuse(member for member in members)  # any iterable of members
    assert jax.tree.all(jax.tree.map(np.array_equal, from_generator.params, fused.params))
    out = run(fused, **batch)
    logits = out.logits
    assert logits.shape == (7, M, 2)
    assert out.features.shape == (7, M, model.config.encoder.width)
    for m, member in enumerate(members):  # three different programs, one function
        alone = run(member, **batch)
        assert_close(logits[:, m], alone.logits)
        # The feature detectors' input: the tanh pooler of the x5 weights, 1.1e-5 of its scale
        # apart between the two programs on a Xeon (the logits, a sum over it, less).
        assert_close(out.features[:, m], alone.features, rtol=5e-5)
        masked = run(model, **batch, head_mask=head_sets[m].astype(np.float32)).logits
        assert_close(logits[:, m], masked)


def test_fused_fine_tuned_members_equal_members_with_averaged_mlp(base, head_sets):
    """In float64 (exact to 1e-10): float32 rounding, amplified through 4 post-LN layers of
    sharpened random weights, reaches 1e-5 here, which would hide a real difference."""
    model, batch = base
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        members = [
            hj.Model(
                m.config,
                jax.tree.map(lambda x: np.float64(x) + 0.05 * rng.normal(size=x.shape), m.params),
            )
            for m in hydra.members_from(model, head_sets)
        ]  # as if fine-tuned separately: every weight differs, MLPs and embeddings included
        logits = hydra.fuse(members)(**batch).logits
        assert logits.dtype == np.float64
        for m, member in enumerate(hydra.with_shared_weights(members)):
            np.testing.assert_allclose(logits[:, m], member(**batch).logits, rtol=0, atol=1e-10)
        # Not the members as they were: the MLP average matters.
        assert not np.allclose(logits[:, 0], members[0](**batch).logits, atol=1e-3)


def test_fuse_refuses_unequal_members(base, head_sets):
    model, _ = base
    uneven = head_sets.copy()
    uneven[1, 2, np.argmin(uneven[1, 2])] = True  # member 1 keeps one more head in layer 2
    with pytest.raises(
        ValueError,
        match=r"unequal head counts per layer: member 0: \[2, 2, 2, 2\]; member 1: \[2, 2, 3, 2\]",
    ):
        hydra.fuse(hydra.members_from(model, uneven))
    with pytest.raises(ValueError, match="at least two members"):
        hydra.fuse(hydra.members_from(model, head_sets[:1]))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: hydra.stratified_head_sets(np.ones((2, 4)), 0), "num_members"),
        (lambda m: hydra.stratified_head_sets(np.ones(8), 2), r"\[L, N\]"),
        (lambda m: hydra.stratified_head_sets(np.full((2, 4), np.nan), 2), "NaN"),
        (lambda m: hydra.baselines.mc_dropout(m, 0), "samples must be a positive integer"),
        (lambda m: hydra.baselines.stack([]), "no members to stack"),
        (lambda m: hydra.circuit_head_sets(m, [], [], 2), "no circuit objectives"),
        (lambda m: hydra.head_sets("best", m, 2), "unknown member strategy 'best'"),
        (lambda m: hydra.head_sets("taylor", m, 4), "4 members do not divide the 6 heads"),
        (lambda m: hydra.head_sets("taylor", m, 2, calibration=[[]]), "for each of 2 members"),
        (lambda m: hydra.head_sets("circuit", m, 2), "uncertainty data for each of 2 members"),
        (
            lambda m: hydra.head_sets("hies", m, 2, calibration=[[], []], alphas=(0.5,)),
            "one alpha per member",
        ),
    ],
)
def test_member_strategies_and_baselines_refuse_bad_arguments(base, call, match):
    model, _ = base
    with pytest.raises(ValueError, match=match):
        call(model)


@pytest.mark.parametrize("family", ["vit", "tower", "dual_tower"])
def test_fused_vision_members_equal_members_run_alone(vision_models, family):
    """One fused encoder for every family: pre-LN, the family's own embedding and head."""
    model, batch = vision_models[family]
    L_family = model.config.encoder.num_layers
    sets = hydra.stratified_head_sets(np.random.default_rng(7).random((L_family, N)), M)
    members = hydra.members_from(model, sets)
    out = run(hydra.fuse(members), **batch)
    assert out.logits.shape == (5, M, model.config.num_labels)
    # Three programs, one function. The masked full model sums over all heads (zeros included),
    # so it rounds differently from the pruned members: ViT logits of about 7 differ by up to
    # about 1.6e-6 of their scale; `assert_close` allows 1e-5 of the scale.
    for m, member in enumerate(members):
        alone = run(member, **batch)
        assert_close(out.logits[:, m], alone.logits)
        assert_close(out.features[:, m], alone.features)
        masked = run(model, **batch, head_mask=sets[m].astype(np.float32)).logits
        assert_close(out.logits[:, m], masked)
    if family != "vit":  # the projected embeddings too
        assert_close(out.embeds[:, 1], run(members[1], **batch).embeds)


def test_features_are_what_the_classifier_reads(base, vision_models):
    """`ModelOutput.features`: a BERT's and a ViT's logits are their dense classifier applied
    to them; a zero-shot tower's are its scaled cosine with the class embeddings."""
    for model, batch in (base, vision_models["vit"]):
        out = run(model, **batch)
        head = model.params["classifier"]
        expected = np.asarray(out.features) @ np.asarray(head["kernel"]) + np.asarray(head["bias"])
        assert_close(out.logits, expected)
    model, batch = vision_models["tower"]
    out = run(model, **batch)
    np.testing.assert_allclose(np.linalg.norm(out.features, axis=-1), 1.0, rtol=1e-5)
    p = model.params
    classes = np.asarray(p["class_embeds"])
    classes = classes / np.linalg.norm(classes, axis=-1, keepdims=True)
    scale = np.exp(np.asarray(p["logit_scale"]))
    assert_close(out.logits, scale * np.asarray(out.features) @ classes.T)


def test_fused_model_saves_and_restores(base, head_sets, vision_models, tmp_path):
    model, batch = base
    fused = hydra.fuse(hydra.members_from(model, head_sets))
    with pytest.raises(hj.ConversionError, match=r"HF format for a HydraConfig.*hj\.save_model"):
        hj.save_pretrained(fused, tmp_path / "hf")  # refused before anything is written
    assert not (tmp_path / "hf").exists()
    hj.save_model(fused, tmp_path / "hydra")
    restored = hj.load_model(tmp_path / "hydra")
    assert restored.config == fused.config
    np.testing.assert_array_equal(run(restored, **batch).logits, run(fused, **batch).logits)
    tower, pixels = vision_models["tower"]
    small = hj.heads.compact(tower, np.tile(np.arange(N) < 3, (2, 1)))  # a compacted tower
    hj.save_model(small, tmp_path / "tower")
    again = hj.load_model(tmp_path / "tower")
    assert again.config == small.config
    np.testing.assert_array_equal(run(again, **pixels).logits, run(small, **pixels).logits)


def test_dropout_runs_per_member(base, head_sets):
    model, batch = base
    fused = hydra.fuse(hydra.members_from(model, head_sets))
    a = fused.apply(fused.params, **batch, dropout_rng=jax.random.key(0)).logits
    b = fused.apply(fused.params, **batch, dropout_rng=jax.random.key(1)).logits
    assert a.shape == (7, M, 2) and not np.allclose(a, b)


def test_mc_dropout_sample_s_is_the_model_under_key_s(base):
    """In float64: the claim is exact (the same dropout masks), and in float32 the compiled
    samples and eager dispatch differ by up to 6e-5 of the logits' scale (a Zen 3 EPYC), where
    rounding of the sharpened weights meets dropout's 1 / (1 - p) rescaling."""
    model, batch = base
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with jax.enable_x64(True):
        model = hj.Model(model.config, jax.tree.map(np.float64, model.params))
        out = np.asarray(hydra.baselines.mc_dropout(model, 3, seed=5)(model.params, inputs))
        keys = jax.random.split(jax.random.key(5), 3)
        want = [model.apply(model.params, **inputs, dropout_rng=k).logits for k in keys]
    assert out.dtype == np.float64 and out.shape == (7, 3, 2)
    assert np.abs(out[:, 0] - out[:, 1]).max() > 1e-2  # the samples differ
    np.testing.assert_allclose(out, np.stack(want, axis=1), rtol=0, atol=1e-10)


def test_taylor_and_hies_member_sets(base):
    model, batch = base
    halves = [[{k: v[:4] for k, v in batch.items()}], [{k: v[3:] for k, v in batch.items()}]]
    taylor = hydra.taylor_head_sets(model, halves, keep_per_layer=2)
    assert taylor.shape == (2, L, N) and np.all(taylor.sum(-1) == 2)
    sets = hydra.hies_head_sets(model, [batch], alphas=(0.0, 1.0), keep_per_layer=2)
    assert np.all(sets.sum(-1) == 2) and not np.array_equal(sets[0], sets[1])
    # The registry dispatches to the same strategies, keeping N / M heads per layer.
    registry = functools.partial(hydra.head_sets, model=model, num_members=2, calibration=halves)
    np.testing.assert_array_equal(registry("taylor"), hydra.taylor_head_sets(model, halves, N // 2))
    np.testing.assert_array_equal(
        registry("hies", alphas=(0.0, 1.0)),
        hydra.hies_head_sets(model, halves[0], (0.0, 1.0), N // 2),
    )
    his = hj.heads.his_and_entropy(model, halves[0])[0]
    np.testing.assert_array_equal(registry("stratified"), hydra.stratified_head_sets(his, 2))


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
    return uncertainty_batches(id_set, ood_set, batch_size=8)


@pytest.fixture(scope="module")
def base_search(base):
    """One `CircuitSearch` (its compiled programs) for every search on `base`, as the library
    reuses one across members' objectives."""
    return CircuitSearch(base[0])


@pytest.mark.parametrize("objective", ["nll", "auroc", "avg"])
def test_circuit_search_equals_naive_reference(base, base_search, uncertainty_set, objective):
    model, _ = base
    keep = base_search(uncertainty_set, keep_per_layer=2, objective=objective)
    assert keep.shape == (L, N) and np.all(keep.sum(1) == 2)
    np.testing.assert_array_equal(keep, naive_circuit(model, uncertainty_set, 2, objective))


@pytest.mark.parametrize("family", ["tower", "dual_tower"])
def test_circuit_search_on_a_vision_tower_equals_naive_reference(vision_models, family):
    tower, batch = vision_models[family]
    channels = batch["pixel_values"].shape[1]
    rng = np.random.default_rng(8)
    pixels = [rng.normal(0.5 * (i >= 9), 1, (channels, 6, 6)).astype(np.float32)
              for i in range(15)]  # fmt: skip
    batches = [{"pixel_values": np.stack(pixels[i : i + 6])} for i in range(0, 15, 6)]
    data = UncertaintyBatches(batches, np.arange(15) >= 9, rng.integers(0, 4, 15))
    keep = circuit_search(tower, data, keep_per_layer=2, objective="avg")
    np.testing.assert_array_equal(keep, naive_circuit(tower, data, 2, "avg"))


def test_circuit_objectives_differ(base_search, uncertainty_set):
    sets = {o: base_search(uncertainty_set, 2, o) for o in ("nll", "auroc")}
    assert not np.array_equal(sets["nll"], sets["auroc"])


def test_harm_semantics():
    data = UncertaintyBatches(
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
