"""BatchEnsemble, LoRA-Ensemble, Packed-Ensembles and MIMO against their definitions: each
member equals the plain model run with its own merged weights (`W * outer(r, s)` and its
biases; `W + (alpha / R) A B` and its head; block-diagonal kernels; MIMO's channel block and
class slice), identity at the neutral initialisation, parameter counts by formula, a frozen
LoRA backbone under `fit`, save / load, and the refusals."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.data import ImageSet, TokenizedSet
from hydra_jax.ensembles import (
    batch_ensemble,
    lora_ensemble,
    mimo,
    packed_ensemble,
    parameter_count,
    trainable,
)
from hydra_jax.models import BertConfig, with_classifier
from hydra_jax.models.efficient import adapted_layers
from hydra_jax.models.mimo import apply_members, member_indices
from hydra_jax.models.packed import from_blocks, grouped_dense, grouped_layers, to_blocks
from hydra_jax.testing import assert_close
from hydra_jax.training import TrainSettings, classification_loss, fit, mimo_loss

pytestmark = pytest.mark.slow  # many compiled programs (`make test-fast` leaves it out)

M, C = 3, 4  # members, classes; every other size differs from both
BERT = BertConfig(
    testing.encoder(layers=2, heads=6, head_dim=5, mlp_dim=26, dropout=0.1),
    vocab_size=37, max_positions=16, type_vocab_size=2,
)  # fmt: skip
VIT = testing.vit(layers=2, heads=2, head_dim=7, mlp_dim=9, layer_norm_eps=1e-6, num_channels=2)


def sharpened(model: hj.Model) -> hj.Model:
    """Weights larger than the 0.02 init, so that a wrong factor moves the logits clearly."""
    return hj.Model(model.config, jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, model.params))


@pytest.fixture(scope="module")
def models():
    rng = np.random.default_rng(0)
    mask = (np.arange(10)[None] < rng.integers(2, 11, (5, 1))).astype(np.int32)
    text = dict(input_ids=rng.integers(1, 37, (5, 10)) * mask, attention_mask=mask)
    images = {"pixel_values": rng.normal(size=(5, 2, 8, 8)).astype(np.float32)}
    bert = sharpened(with_classifier(hj.Model.init(BERT, jax.random.key(0)), C, jax.random.key(1)))
    vit = sharpened(with_classifier(hj.Model.init(VIT, jax.random.key(2)), C, jax.random.key(3)))
    return {"bert": (bert, text), "vit": (vit, images)}


def logits(model: hj.Model, batch: dict) -> np.ndarray:
    return np.asarray(jax.jit(lambda p, b: model.apply(p, **b).logits)(model.params, batch))


def merged(ensemble: hj.Model, m: int) -> dict:
    """Member m's weights for the plain model, written from the definitions."""
    config, params = ensemble.config, ensemble.params
    flat = traverse_util.flatten_dict(params["shared"])
    own = jax.tree.map(lambda x: x[m], params["members"])
    flat.update(traverse_util.flatten_dict(own.get("params", {})))
    adapters = traverse_util.flatten_dict(own["adapters"])
    for path, layer in adapted_layers(config).items():
        key = tuple(path.split("/"))
        W = flat[(*key, "kernel")]
        n_in, n_out = len(layer.in_shape), len(layer.out_shape)
        if isinstance(config, hj.models.BatchEnsembleConfig):
            r, s = adapters[(*key, "r")], adapters[(*key, "s")]
            outer = r.reshape(r.shape + (1,) * n_out) * s.reshape((1,) * n_in + s.shape)
            flat[(*key, "kernel")] = W * outer
            if layer.bias:
                flat[(*key, "bias")] = adapters[(*key, "bias")]
        else:
            a, b = adapters[(*key, "a")], adapters[(*key, "b")]
            flat[(*key, "kernel")] = W + config.scale * jnp.tensordot(a, b, axes=1)
    return traverse_util.unflatten_dict(flat)


def randomised(ensemble: hj.Model, key: jax.Array) -> hj.Model:
    """The ensemble with every adapter weight drawn at random (LoRA's `b` is no longer 0)."""
    adapters = ensemble.params["members"]["adapters"]
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(key, len(leaves))
    drawn = [x + 0.5 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    members = {**ensemble.params["members"], "adapters": jax.tree.unflatten(tree, drawn)}
    return hj.Model(ensemble.config, {**ensemble.params, "members": members})


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_each_batch_ensemble_member_is_the_model_with_its_rank_one_kernels(models, family):
    model, batch = models[family]
    ensemble = randomised(batch_ensemble(model, M, jax.random.key(4)), jax.random.key(5))
    out = logits(ensemble, batch)  # [B, M, C]
    assert out.shape == (len(next(iter(batch.values()))), M, C)
    for m in range(M):
        assert_close(out[:, m], logits(hj.Model(model.config, merged(ensemble, m)), batch))
    assert np.abs(out[:, 0] - out[:, 1]).max() > 1e-2  # the members differ


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_each_lora_member_is_the_model_with_its_merged_adapters_and_head(models, family):
    model, batch = models[family]
    ensemble = lora_ensemble(model, M, jax.random.key(6), rank=2, alpha=3.0, num_labels=C)
    ensemble = randomised(ensemble, jax.random.key(7))
    out = logits(ensemble, batch)
    for m in range(M):
        assert_close(out[:, m], logits(hj.Model(ensemble.config.member, merged(ensemble, m)),
                                       batch))  # fmt: skip
    assert np.abs(out[:, 0] - out[:, 1]).max() > 1e-2


def test_neutral_initialisations_equal_the_model(models):
    """Factors of 1 (BatchEnsemble) and B = 0 (LoRA, heads copied): every member is the model."""
    model, batch = models["bert"]
    base = logits(model, batch)
    for ensemble in (batch_ensemble(model, M, jax.random.key(8), factor_std=0.0),
                     lora_ensemble(model, M, jax.random.key(9), rank=3)):  # fmt: skip
        out = logits(ensemble, batch)
        for m in range(M):
            assert_close(out[:, m], base)


def test_targets_limit_which_layers_lora_adapts(models):
    model, batch = models["bert"]
    ensemble = lora_ensemble(model, M, jax.random.key(10), rank=2, targets=("value",))
    layers = adapted_layers(ensemble.config)
    assert sorted(layers) == ["encoder/layer_0/attention/value", "encoder/layer_1/attention/value"]
    assert_close(logits(randomised(ensemble, jax.random.key(11)), batch)[:, 1],
                 logits(hj.Model(model.config, merged(randomised(ensemble, jax.random.key(11)), 1)),
                        batch))  # fmt: skip


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_parameter_counts_follow_the_formulas(models, family):
    model, _ = models[family]
    size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    be = batch_ensemble(model, M, jax.random.key(12))
    layers = adapted_layers(be.config).values()
    extra = sum(math.prod(d.in_shape) + 2 * math.prod(d.out_shape) for d in layers)
    shared_biases = sum(math.prod(d.out_shape) for d in layers)
    assert size(be.params) == parameter_count(be, model) == size(model.params) + M * extra - \
        shared_biases  # fmt: skip
    lora = lora_ensemble(model, M, jax.random.key(13), rank=2)
    head = size(model.params["classifier"])
    adapters = sum(2 * (math.prod(d.in_shape) + math.prod(d.out_shape))
                   for d in adapted_layers(lora.config).values())  # fmt: skip
    assert size(lora.params) == parameter_count(lora, model)
    assert size(lora.params) == size(model.params) + (M - 1) * head + M * adapters


def test_dropout_draws_a_key_per_member(models):
    model, batch = models["bert"]
    ensemble = batch_ensemble(model, M, jax.random.key(14), factor_std=0.0)
    out = ensemble.apply(ensemble.params, **batch, dropout_rng=jax.random.key(15)).logits
    assert np.abs(np.asarray(out[:, 0] - out[:, 1])).max() > 1e-3


def test_lora_fit_trains_adapters_and_heads_only_and_save_load_round_trips(models, tmp_path):
    model, _ = models["bert"]
    rng = np.random.default_rng(1)
    tokens = [np.r_[1, rng.integers(4, 30, 6), 2].astype(np.int32) for _ in range(16)]
    data = TokenizedSet(tokens, rng.integers(0, C, 16))
    ensemble = lora_ensemble(model, M, jax.random.key(16), rank=2)
    settings = TrainSettings(epochs=1, batch_size=8, learning_rate=1e-2, checkpoint_every=100)
    trained = fit(ensemble, data, settings, tmp_path / "fit", trainable=trainable(ensemble))
    for a, b in zip(jax.tree.leaves(ensemble.params["shared"]),
                    jax.tree.leaves(trained.params["shared"]), strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)  # the frozen backbone
    moved = [np.abs(np.asarray(a - b)).max() for a, b in zip(
        jax.tree.leaves(ensemble.params["members"]), jax.tree.leaves(trained.params["members"]),
        strict=True)]  # fmt: skip
    assert min(moved) > 0  # every adapter and head trained
    hj.save_model(trained, tmp_path / "saved")
    loaded = hj.load_model(tmp_path / "saved")
    assert loaded.config == trained.config
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(trained.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_batch_ensemble_fit_trains_factors_and_shared_weights(models, tmp_path):
    model, _ = models["bert"]
    rng = np.random.default_rng(2)
    tokens = [np.r_[1, rng.integers(4, 30, 6), 2].astype(np.int32) for _ in range(16)]
    data = TokenizedSet(tokens, rng.integers(0, C, 16))
    ensemble = batch_ensemble(model, M, jax.random.key(17))
    settings = TrainSettings(epochs=1, batch_size=8, learning_rate=1e-2, checkpoint_every=100)
    trained = fit(ensemble, data, settings, tmp_path, trainable=trainable(ensemble))
    for part in ("shared", "members"):
        before, after = ensemble.params[part], trained.params[part]
        assert any(np.abs(np.asarray(a - b)).max() > 0 for a, b in zip(
            jax.tree.leaves(before), jax.tree.leaves(after), strict=True))  # fmt: skip


def test_bad_arguments_are_refused_by_name(models):
    model, _ = models["bert"]
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="no classifier"):
        batch_ensemble(hj.Model.init(BERT, key), M, key)
    with pytest.raises(ValueError, match="num_members must be a positive integer"):
        lora_ensemble(model, 0, key)
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        lora_ensemble(model, M, key, rank=0)
    with pytest.raises(ValueError, match="LoRA targets"):
        lora_ensemble(model, M, key, targets=("fc1",))
    with pytest.raises(ValueError, match="factor_std"):
        batch_ensemble(model, M, key, factor_std=-1.0)
    ensemble = batch_ensemble(model, M, key)
    with pytest.raises(TypeError, match="takes one model"):
        lora_ensemble(ensemble, M, key)
    with pytest.raises(TypeError, match="with_classifier takes"):
        with_classifier(ensemble, 2, key)
    with pytest.raises(TypeError, match="trainable takes"):
        trainable(model)


# Packed-Ensembles: trained from scratch, so only architectures and identities to check.
PACKED_VIT = testing.vit(layers=2, heads=3, head_dim=8, mlp_dim=20, layer_norm_eps=1e-6,
                         num_channels=2, num_labels=C)  # fmt: skip
PACKED_BERT = testing.bert(layers=2, heads=3, head_dim=8, mlp_dim=20, vocab_size=37,
                           max_positions=16, num_labels=C)  # fmt: skip


@pytest.mark.parametrize("inputs", [1, 2])
def test_grouped_layers_are_their_block_diagonal_dense_layers(inputs):
    """`grouped_dense` == `x @ from_blocks(kernel)`, and `to_blocks` inverts `from_blocks`."""
    rng = np.random.default_rng(3)
    G = 3
    shape = (G, 2, 5, 4) if inputs == 2 else (G, 4, 3, 2)  # [G, in_0/G, ..., out_0/G, ...]
    blocks = jnp.asarray(rng.normal(size=shape), jnp.float32)
    dense = from_blocks(blocks, inputs)
    assert dense.shape == ((6, 5, 12) if inputs == 2 else (12, 9, 2))
    x = jnp.asarray(rng.normal(size=(7, *dense.shape[:inputs])), jnp.float32)
    bias = jnp.asarray(rng.normal(size=dense.shape[inputs:]), jnp.float32)
    want = jnp.tensordot(x, dense, axes=inputs) + bias[None]
    assert_close(grouped_dense(x, blocks, bias, inputs, None), want)
    np.testing.assert_array_equal(to_blocks(dense, inputs, G), blocks)
    assert np.count_nonzero(np.asarray(dense)) == blocks.size  # zeros off the diagonal blocks


def test_one_packed_member_at_alpha_1_is_the_plain_model():
    """alpha = 1, gamma = 1, M = 1: the plain model's function on the same weights."""
    model = hj.Model.init(PACKED_VIT, jax.random.key(20))
    packed = packed_ensemble(PACKED_VIT, 1, jax.random.key(21), alpha=1.0)
    assert packed.config.member == PACKED_VIT
    params = {"members": jax.tree.map(lambda x: x[None], model.params)}
    images = {"pixel_values": np.random.default_rng(4).normal(size=(5, 2, 8, 8)).astype(np.float32)}
    got = hj.Model(packed.config, params)(**images).logits
    assert_close(got[:, 0], model(**images).logits)


def test_packed_members_are_narrow_models_with_grouped_layers():
    """M = 2, alpha = 2, gamma = 2: each member has width 24, 6 heads of 4, MLP 20, and equals
    its own dense model with block-diagonal kernels; the count follows the formula."""
    packed = packed_ensemble(PACKED_VIT, 2, jax.random.key(22), alpha=2.0, groups=2)
    e = packed.config.member.encoder
    assert (e.width, e.num_heads, e.head_dim, e.mlp_dim) == (24, (6, 6), 4, 20)
    layers = grouped_layers(packed.config)
    assert sorted(p.split("/")[-1] for p in layers) == sorted(
        ["query", "key", "value", "out", "fc1", "fc2"] * 2)  # fmt: skip
    images = {"pixel_values": np.random.default_rng(5).normal(size=(5, 2, 8, 8)).astype(np.float32)}
    out = np.asarray(packed(**images).logits)
    assert out.shape == (5, 2, C)
    for m in range(2):
        own = jax.tree.map(lambda x, m=m: x[m], packed.params["members"])
        flat = traverse_util.flatten_dict(own)
        for path, layer in layers.items():
            key = (*path.split("/"), "kernel")
            flat[key] = from_blocks(flat[key], layer.inputs)
        dense = hj.Model(packed.config.member, traverse_util.unflatten_dict(flat))
        assert_close(out[:, m], dense(**images).logits)
    size = sum(x.size for x in jax.tree.leaves(packed.params))
    assert size == parameter_count(packed)
    dense_size = sum(
        x.size
        for x in jax.tree.leaves(hj.Model.init(packed.config.member, jax.random.key(0)).params)
    )
    halved = sum(math.prod(d.kernel) // 2 for d in layers.values())
    assert size == 2 * (dense_size - halved)


def test_packed_ensembles_train_save_and_refuse_bad_shapes(tmp_path):
    packed = packed_ensemble(PACKED_BERT, 2, jax.random.key(23), alpha=2.0, groups=2)
    rng = np.random.default_rng(6)
    tokens = [np.r_[1, rng.integers(4, 30, 6), 2].astype(np.int32) for _ in range(16)]
    data = TokenizedSet(tokens, rng.integers(0, C, 16))
    settings = TrainSettings(epochs=1, batch_size=8, learning_rate=1e-2, checkpoint_every=100)
    trained = fit(packed, data, settings, tmp_path / "fit", trainable=trainable(packed))
    assert any(np.abs(np.asarray(a - b)).max() > 0 for a, b in zip(
        jax.tree.leaves(packed.params), jax.tree.leaves(trained.params), strict=True))  # fmt: skip
    hj.save_model(trained, tmp_path / "saved")
    loaded = hj.load_model(tmp_path / "saved")
    assert loaded.config == trained.config
    with pytest.raises(ValueError, match=r"member width alpha\*D/M = 9.6 must be a whole multiple"):
        packed_ensemble(PACKED_BERT, 5, jax.random.key(0), alpha=2.0)
    with pytest.raises(TypeError, match="takes one architecture"):
        packed_ensemble(packed.config, 2, jax.random.key(0))


# MIMO: one network, M x the channels and classes, trained from scratch.
MIMO_VIT = testing.vit(layers=2, heads=3, head_dim=5, mlp_dim=11, layer_norm_eps=1e-6,
                       num_channels=2, num_labels=C)  # fmt: skip


@pytest.fixture(scope="module")
def mimo_model():
    model = sharpened(mimo(MIMO_VIT, M, jax.random.key(30)))
    images = np.random.default_rng(7).normal(size=(5, M, 2, 8, 8)).astype(np.float32)
    return model, images


def test_one_mimo_member_is_the_plain_model():
    model = hj.Model.init(MIMO_VIT, jax.random.key(31))
    one = mimo(MIMO_VIT, 1, jax.random.key(32))
    assert jax.tree.map(np.shape, one.params) == jax.tree.map(np.shape, model.params)
    images = {"pixel_values": np.random.default_rng(8).normal(size=(5, 2, 8, 8)).astype(np.float32)}
    got = hj.Model(one.config, model.params)(**images).logits
    assert got.shape == (5, 1, C)
    assert_close(got[:, 0], model(**images).logits)


def test_mimo_members_read_their_channel_blocks_and_own_their_class_slices(mimo_model):
    """Member m's logits are classes m C .. (m + 1) C of the plain model with M x 2 channels on
    the images stacked channel-wise; at test time (one image) the same with M copies."""
    model, images = mimo_model
    wide = dataclasses.replace(MIMO_VIT, num_channels=2 * M, num_labels=C * M)
    stacked = np.concatenate([images[:, m] for m in range(M)], axis=1)  # [B, 2M, H, W]
    plain = np.asarray(hj.Model(wide, model.params)(pixel_values=stacked).logits)
    got = np.asarray(jax.jit(lambda p, x: apply_members(model.config, p, x).logits)(
        model.params, images))  # fmt: skip
    for m in range(M):
        assert_close(got[:, m], plain[:, m * C : (m + 1) * C])
    one = images[:, 0]
    copies = np.asarray(apply_members(model.config, model.params,
                                      np.repeat(one[:, None], M, axis=1)).logits)  # fmt: skip
    assert_close(logits(model, {"pixel_values": one}), copies)
    assert np.abs(got[:, 1] - copies[:, 1]).max() > 1e-2  # member 1 did read its own image


def test_mimo_parameter_count_follows_the_formula(mimo_model):
    """M - 1 more patch kernels and classifiers (DeiT with its teacher: both heads)."""
    model, _ = mimo_model
    size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    for member in (
        MIMO_VIT,
        dataclasses.replace(
            MIMO_VIT, model_type="deit", distillation_token=True, distilled_head=True
        ),
    ):
        ensemble = model if member == MIMO_VIT else mimo(member, M, jax.random.key(33))
        one = hj.Model.init(member, jax.random.key(0)).params
        heads = ["classifier", "distillation_classifier"][: 1 + member.distilled_head]
        extra = 4 * 4 * 2 * 15 + sum(15 * C + C for _ in heads)  # P P C D; D C + C per head
        assert size(ensemble.params) == parameter_count(ensemble) == size(one) + (M - 1) * extra


def test_member_indices_shuffle_each_member_and_repeat_inputs_on_request():
    key = jax.random.key(34)
    rows = np.asarray(member_indices(key, 6, M, repetitions=2))
    assert rows.shape == (M, 12)
    for row in rows:  # each member sees every example of the batch, twice
        np.testing.assert_array_equal(np.sort(row), np.repeat(np.arange(6), 2))
    assert len({tuple(r) for r in rows}) == M  # independent orders
    half = np.asarray(member_indices(key, 8, M, input_repetition=0.5))
    np.testing.assert_array_equal(half[:, 4:], np.broadcast_to(half[0, 4:], (M, 4)))
    assert len({tuple(r[:4]) for r in half}) > 1
    same = np.asarray(member_indices(key, 8, M, input_repetition=1.0))
    np.testing.assert_array_equal(same, np.broadcast_to(same[0], (M, 8)))


def test_mimo_loss_sums_the_members_cross_entropies(mimo_model):
    """With every input repeated, each member reads the batch's images with their labels:
    the loss is M x the mean member cross-entropy of the test-time forward pass."""
    model, images = mimo_model
    batch = {"pixel_values": images[:, 0], "labels": np.array([0, 3, 1, 2, 3])}
    key = jax.random.key(35)
    loss, accuracy = mimo_loss(model, input_repetition=1.0)(model.params, batch, key)
    mean, mean_accuracy = classification_loss(model)(model.params, batch, None)
    assert_close(loss, M * mean)
    assert_close(accuracy, mean_accuracy)
    shuffled, _ = mimo_loss(model, repetitions=2)(model.params, batch, key)
    shuffle_key, _ = jax.random.split(key)  # the loss draws its pairings with this half
    rows = np.asarray(member_indices(shuffle_key, 5, M, repetitions=2)).T  # [2B, M]
    out = apply_members(model.config, model.params, batch["pixel_values"][rows]).logits
    labels = batch["labels"][rows]
    ce = optax.softmax_cross_entropy_with_integer_labels
    want = sum(ce(out[:, m], labels[:, m]).mean() for m in range(M))
    assert_close(shuffled, want)  # member m's image with member m's label
    assert abs(float(shuffled) - float(loss)) > 1e-3


def test_mimo_trains_saves_and_refuses_what_it_cannot_be(mimo_model, tmp_path):
    model, _ = mimo_model
    rng = np.random.default_rng(9)
    data = ImageSet(rng.normal(size=(16, 2, 8, 8)).astype(np.float32), rng.integers(0, C, 16))
    settings = TrainSettings(epochs=1, batch_size=8, learning_rate=1e-2, checkpoint_every=100)
    trained = fit(model, data, settings, tmp_path / "fit", loss=mimo_loss(model, 2, 0.25))
    for layer in ("patch", "classifier"):  # the wide input and output layers learn
        moved = model.params[layer]["kernel"] - trained.params[layer]["kernel"]
        assert np.abs(np.asarray(moved)).max() > 0
    hj.save_model(trained, tmp_path / "saved")
    loaded = hj.load_model(tmp_path / "saved")
    assert loaded.config == trained.config
    assert trainable(loaded)(("patch", "kernel"))
    with pytest.raises(TypeError, match="MIMO takes an image classifier"):
        mimo(PACKED_BERT, M, jax.random.key(0))
    with pytest.raises(ValueError, match="num_labels"):
        mimo(dataclasses.replace(MIMO_VIT, num_labels=0), M, jax.random.key(0))
    with pytest.raises(TypeError, match="takes one architecture"):
        mimo(model.config, M, jax.random.key(0))
    with pytest.raises(ValueError, match=r"input_repetition must lie in \[0, 1\], got 1.5"):
        mimo_loss(model, input_repetition=1.5)
    with pytest.raises(TypeError, match="mimo_loss takes a MIMO"):
        mimo_loss(hj.Model.init(MIMO_VIT, jax.random.key(0)))
    with pytest.raises(ValueError, match=r"expected \[B, 3, 2, H, W\]"):
        apply_members(model.config, model.params, np.zeros((2, 2, 8, 8), np.float32))
