"""Head scores against independent references; selection; surgery equals masking."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compiled import run

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.ensembles import members_from
from hydra_jax.evaluation import xla_flops
from hydra_jax.heads import (
    attention_entropy,
    compact,
    expand_to_full,
    hies,
    his_and_entropy,
    keep_mask,
    score,
)
from hydra_jax.models import (
    BertConfig,
    CLIPVisionTowerConfig,
    with_classifier,
)
from hydra_jax.testing import assert_close

L, N, K = 3, 4, 5
BERT = BertConfig(
    testing.encoder(layers=L, heads=N, head_dim=K, mlp_dim=22),
    vocab_size=31, max_positions=12, type_vocab_size=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def bert():
    model = with_classifier(hj.Model.init(BERT, jax.random.key(0)), 3, jax.random.key(1))
    # Larger weights than the 0.02 init so that heads differ clearly.
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, model.params)
    model = hj.Model(model.config, params)
    rng = np.random.default_rng(0)
    lengths = np.array([9, 4, 7, 2, 9])
    mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int32)
    batch = dict(input_ids=rng.integers(1, 31, (5, 9)) * mask, attention_mask=mask,
                 labels=rng.integers(0, 3, 5))  # fmt: skip
    return model, batch


def test_his_equals_per_example_float64_finite_differences(bert):
    model, batch = bert
    with jax.enable_x64(True):
        m64 = hj.Model(
            model.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), model.params)
        )
        his, _ = his_and_entropy(m64, [batch])
        eps = 1e-7  # the scaled-up weights make the loss curved: 1e-6 leaves ~1e-6 truncation
        reference = np.zeros((L, N))
        for b in range(5):
            example = {k: v[b : b + 1] for k, v in batch.items()}

            @jax.jit
            def loss(mask, example=example):
                logits = m64.apply(m64.params, **example, head_mask=mask).logits
                return optax.softmax_cross_entropy_with_integer_labels(logits, example["labels"])[0]

            for l in range(L):
                for h in range(N):
                    e = jnp.zeros((L, N), jnp.float64).at[l, h].set(eps)
                    ones = jnp.ones((L, N), jnp.float64)
                    reference[l, h] += abs(float(loss(ones + e) - loss(ones - e)) / (2 * eps)) / 5
    assert reference.max() > 1e-3
    np.testing.assert_allclose(his, reference, rtol=1e-6, atol=1e-10)


def test_his_is_not_the_absolute_batch_mean_gradient(bert):
    model, batch = bert
    his, _ = his_and_entropy(model, [batch])
    mean_grad = jax.jit(
        jax.grad(
            lambda m: optax.softmax_cross_entropy_with_integer_labels(
                model.apply(model.params, **batch, head_mask=m).logits, batch["labels"]
            ).mean()
        )
    )(jnp.ones((L, N)))
    # |mean| <= mean |.| (equal where every example's gradient has one sign); two programs, so
    # float32 rounding at 1e-5 of the scale (about 1e-6 here) separates the sides.
    bound = np.abs(np.asarray(mean_grad))
    assert np.all(his >= bound - 1e-5 * bound.max())
    assert not np.allclose(his, np.abs(mean_grad), rtol=1e-3)


def test_his_without_labels_uses_the_models_own_prediction(bert):
    """The claim is that the same labels reach the loss, so it is checked exactly, in float64:
    the two sides are different programs (labels as an input vs the argmax inside), whose float32
    roundings differ by about 1e-6 and by CPU kind."""
    model, batch = bert
    with jax.enable_x64(True):
        m64 = hj.Model(model.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64),
                                                  model.params))  # fmt: skip
        predicted = np.asarray(m64(**batch).logits.argmax(-1))
        assert not np.array_equal(predicted, batch["labels"])  # the test can tell them apart
        unlabeled, _ = his_and_entropy(m64, [{**batch, "labels": predicted}])
        self_labeled, _ = his_and_entropy(m64, [batch], use_labels=False)
    np.testing.assert_allclose(self_labeled, unlabeled, rtol=1e-12)


def test_entropy_equals_numpy_from_returned_attentions(bert):
    model, batch = bert
    attentions = np.asarray(model(**batch, output_attentions=True).attentions, np.float64)
    expected = np.zeros((L, N))
    for b, length in enumerate(batch["attention_mask"].sum(1)):
        for l in range(L):
            for h in range(N):
                rows = attentions[l, b, h, :length, :length]  # valid queries and keys only
                assert np.allclose(rows.sum(-1), 1.0, atol=1e-5)
                ent = -np.sum(np.where(rows > 0, rows * np.log(rows), 0.0), axis=-1)
                expected[l, h] += (ent / np.log(length)).mean() / 5
    _, entropy = his_and_entropy(model, [batch])
    assert_close(entropy, expected)  # two programs: the scoring one and the forward
    assert np.all((entropy >= 0) & (entropy <= 1))
    # Two batches give the mean over all examples (programs of other batch shapes).
    halves = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    assert_close(his_and_entropy(model, halves)[1], entropy)


@pytest.fixture(scope="module")
def image_classifiers():
    """A ViT classifier and a CLIP vision tower with a zero-shot head (2 layers of 6 and of 3
    heads: distinct from each other's other axes and from the BERT's), on 3 images."""
    vit = testing.vit(layers=2, heads=6, head_dim=2, mlp_dim=9, layer_norm_eps=1e-6,
                      num_channels=1, num_labels=3)  # fmt: skip
    clip = testing.clip(vision=dict(layers=2, heads=3, head_dim=4, mlp_dim=7), image_size=6,
                        patch_size=2, num_channels=2)  # fmt: skip
    tower = CLIPVisionTowerConfig(clip.vision, 5)
    rng = np.random.default_rng(4)
    models = {
        "vit": hj.Model.init(vit, jax.random.key(5)),
        "tower": with_classifier(hj.Model.init(tower, jax.random.key(6)), 4, jax.random.key(7)),
    }
    pixels = {"vit": rng.normal(size=(3, 1, 8, 8)), "tower": rng.normal(size=(3, 2, 6, 6))}
    return {
        k: (hj.Model(m.config, jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, m.params)),
            {"pixel_values": pixels[k].astype(np.float32), "labels": np.array([0, 2, 1])})
        for k, m in models.items()
    }  # fmt: skip


@pytest.mark.parametrize("family", ["vit", "tower"])
def test_image_models_score_per_example_and_over_every_token(image_classifiers, family):
    """HIS: the mean of per-example |gradients| (one `jax.grad` per image); AE: every query row
    and key counts (images have no padding to leave out)."""
    model, batch = image_classifiers[family]
    encoder = model.config.encoder
    shape = (encoder.num_layers, encoder.num_heads[0])
    with jax.enable_x64(True):  # exact comparison: float32 rounding differs between the two
        m64 = hj.Model(model.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64),
                                                  model.params))  # fmt: skip
        b64 = {**batch, "pixel_values": batch["pixel_values"].astype(np.float64)}
        his, _ = his_and_entropy(m64, [b64])

        def loss(mask, example):
            logits = m64.apply(m64.params, **example, head_mask=mask).logits
            return optax.softmax_cross_entropy_with_integer_labels(logits, example["labels"])[0]

        grad = jax.jit(jax.grad(loss))  # one program for the 3 examples
        reference = np.zeros(shape)
        for b in range(3):
            example = {k: v[b : b + 1] for k, v in b64.items()}
            reference += np.abs(np.asarray(grad(jnp.ones(shape, jnp.float64), example))) / 3
    assert reference.max() > 1e-4
    np.testing.assert_allclose(his, reference, rtol=1e-10)
    _, entropy = his_and_entropy(model, [batch])
    attentions = np.asarray(model(**batch, output_attentions=True).attentions, np.float64)
    S = attentions.shape[-1]  # CLS + patches
    plogp = np.where(attentions > 0, attentions * np.log(np.maximum(attentions, 1e-300)), 0.0)
    rows = -plogp.sum(-1) / np.log(S)  # [L, B, N, T]: every query row, every key
    assert_close(entropy, rows.mean(axis=(1, 3)))  # the scoring program vs the forward
    assert hj.heads.score(model, [batch], method="hies").shape == shape


def test_entropy_of_uniform_attention_is_one():
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    uniform = mask[:, None, :] / mask.sum(-1)[:, None, None]  # [B, T, S]
    attentions = np.broadcast_to(uniform[None, :, None], (2, 2, 3, 4, 4))  # [L, B, N, T, S]
    np.testing.assert_allclose(attention_entropy(jnp.asarray(attentions), mask), 1.0, atol=1e-6)


def test_hies_and_baselines_follow_their_formulas(bert):
    model, batch = bert
    his, entropy = his_and_entropy(model, [batch])
    norm = lambda x: (x - x.min()) / (x.max() - x.min())  # noqa: E731
    for alpha in (0.0, 0.3, 1.0):
        expected = alpha * norm(his) + (1 - alpha) * (1 - norm(entropy))
        np.testing.assert_allclose(hies(his, entropy, alpha), expected, atol=1e-12)
    # `score` runs the same compiled scoring program on the same batch: equal up to the float64
    # arithmetic of the combination.
    np.testing.assert_allclose(
        score(model, [batch], "hies", alpha=0.3), hies(his, entropy, 0.3), atol=1e-9
    )
    np.testing.assert_allclose(score(model, [batch], "ad"), 1 - entropy, atol=1e-9)
    normalized = score(model, [batch], "taylor", layer_normalize=True)
    np.testing.assert_allclose(normalized, his / np.linalg.norm(his, axis=1, keepdims=True))
    l2 = score(model, method="l2", global_minmax=True)
    assert l2.min() == 0.0 and l2.max() == 1.0
    attention = model.params["encoder"]["layer_1"]["attention"]
    q, k, v = (np.asarray(attention[n]["kernel"])[:, 2] for n in ("query", "key", "value"))
    o = np.asarray(attention["out"]["kernel"])[2]
    expected = np.sqrt((q**2).sum() + (k**2).sum() + (v**2).sum() + (o**2).sum())
    # float32 sums of 80 squares in two orders (NumPy's SIMD loops differ by CPU kind): 1e-5
    assert score(model, method="l2")[1, 2] == pytest.approx(expected, rel=1e-5)
    r0, r1 = score(model, method="random", seed=0), score(model, method="random", seed=1)
    assert r0.shape == (L, N) and not np.allclose(r0, r1)
    np.testing.assert_array_equal(r0, score(model, method="random", seed=0))


def test_bad_scoring_input(bert):
    model, batch = bert
    with pytest.raises(ValueError, match="unknown scoring method 'fisher'"):
        score(model, [batch], "fisher")
    with pytest.raises(ValueError, match="needs calibration batches"):
        score(model, None, "his")
    with pytest.raises(ValueError, match="alpha must be in"):
        hies(np.ones((2, 2)), np.ones((2, 2)), 1.5)
    with pytest.raises(ValueError, match="no calibration examples"):
        his_and_entropy(model, [])
    with pytest.raises(ValueError, match=r"his and entropy must both be \[L, N\]"):
        hies(np.ones((2, 2)), np.ones((3, 2)), 0.5)
    with pytest.raises(ValueError, match="NaN/inf"):
        hies(np.full((2, 2), np.nan), np.ones((2, 2)), 0.5)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ([0, 5, 0, 1, 2], r"labels must be classes in \[0, 3\); examples \[1\] have \[5\]"),
        ([0, -1, 0, 1, 2], r"labels must be classes in \[0, 3\)"),  # JAX took them silently
        ([0.0, 1.0, 0.0, 1.0, 2.0], "labels must be integer classes"),
        ([0], r"labels must be \[B\] = \[5\]"),
    ],
)
def test_scoring_refuses_bad_calibration_labels(bert, labels, message):
    model, batch = bert
    with pytest.raises(ValueError, match="calibration batch 0: " + message):
        his_and_entropy(model, [{**batch, "labels": np.array(labels)}])


def test_keep_mask_global_ratio_and_per_layer():
    scores = np.arange(12.0).reshape(3, 4)  # layer 0 holds the four weakest heads
    keep = keep_mask(scores, ratio=0.34)  # round(0.34 * 12) = 4 heads removed
    assert keep.sum() == 8 and not keep[0].any()  # a layer may lose every head
    np.testing.assert_array_equal(keep_mask(scores, ratio=0.0), np.ones((3, 4), bool))
    per_layer = keep_mask(-scores, keep_per_layer=1)
    np.testing.assert_array_equal(per_layer, np.eye(4, dtype=bool)[[0, 0, 0]])
    tied = keep_mask(np.zeros((2, 3)), ratio=0.5)
    np.testing.assert_array_equal(tied, [[False, False, False], [True, True, True]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(ratio=1.0), r"ratio must be in \[0, 1\), got 1.0"),
        (dict(ratio=-0.1), r"ratio must be in \[0, 1\)"),
        (dict(keep_per_layer=0), r"keep_per_layer must be in \[1, 4\]"),
        (dict(), "exactly one of"),
        (dict(ratio=0.1, keep_per_layer=2), "exactly one of"),
        (dict(keep_per_layer=1.5), r"keep_per_layer must be an integer, got 1.5"),
        (dict(ratio=True), r"ratio must be a number"),
    ],
)
def test_keep_mask_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keep_mask(np.ones((3, 4)), **kwargs)


def test_keep_mask_bad_scores():
    with pytest.raises(ValueError, match=r"scores must be \[L, N\], got shape \(12,\)"):
        keep_mask(np.ones(12), ratio=0.5)
    with pytest.raises(ValueError, match="NaN"):
        keep_mask(np.array([[np.nan, 1.0]]), ratio=0.5)


# ----------------------------------------------------------------------------- surgery


def random_keep(seed: int, L: int, N: int) -> np.ndarray:
    keep = np.random.default_rng(seed).random((L, N)) > 0.5
    keep[0] = False  # an emptied layer
    keep[-1, -1] = True
    return keep


def test_compact_bert_equals_masked_and_cuts_flops(bert):
    model, batch = bert
    keep = random_keep(3, L, N)
    small = compact(model, keep)
    assert small.config.encoder.num_heads == tuple(int(k) for k in keep.sum(1))
    masked = model(**batch, head_mask=keep.astype(np.float32)).logits
    assert_close(small(**batch).logits, masked)
    # A compacted model still takes a (per-layer) head mask.
    rows = [np.ones(int(n)) for n in keep.sum(1)]
    assert_close(small(**batch, head_mask=rows).logits, masked)

    def flops(m):
        forward = jax.jit(lambda p: m.apply(p, **batch).logits)
        return xla_flops(forward.lower(m.params).compile())

    removed = L * N - keep.sum()
    B, T, D = (*batch["input_ids"].shape, N * K)
    # Per removed head: q/k/v/o projections (4 x 2TDK) and QK^T and attention x V (2 x 2TTK),
    # plus elementwise work on its [T, S] scores (scaling, bias, softmax) that XLA also counts.
    matmuls = removed * B * (4 * 2 * T * D * K + 2 * 2 * T * T * K)
    saved = flops(model) - flops(small)
    assert matmuls <= saved <= 1.3 * matmuls


def test_compact_vit_and_clip_towers_equal_masked():
    vit = hj.Model.init(
        testing.vit(layers=2, heads=3, head_dim=4, mlp_dim=14, layer_norm_eps=1e-6, num_labels=2),
        jax.random.key(2),
    )
    pixels = np.random.default_rng(1).normal(size=(2, 3, 8, 8)).astype(np.float32)
    keep = random_keep(4, 2, 3)
    masked = run(vit, pixel_values=pixels, head_mask=keep.astype(np.float32)).logits
    small = compact(vit, keep)
    assert_close(run(small, pixel_values=pixels).logits, masked)
    # ... and exportable, as a full-size ViT whose removed heads are zero.
    full = expand_to_full(small)
    assert_close(run(full, pixel_values=pixels).logits, masked)
    clip = hj.Model.init(
        testing.clip(text=dict(layers=2, heads=2, head_dim=4, mlp_dim=10),
                     vision=dict(layers=2, heads=3, head_dim=3, mlp_dim=11), vocab_size=20,
                     max_positions=6, image_size=6, patch_size=3, projection_dim=5),
        jax.random.key(3),
    )  # fmt: skip
    ids = np.array([[1, 4, 5, 19, 0, 0], [1, 7, 8, 9, 10, 19]])
    inputs = dict(input_ids=ids, attention_mask=(ids > 0).astype(np.int32),
                  pixel_values=np.ones((1, 3, 6, 6), np.float32))  # fmt: skip
    keep_text, keep_vision = random_keep(5, 2, 2), random_keep(6, 2, 3)
    small = compact(clip, {"text": keep_text, "vision": keep_vision})
    masked = run(clip, **inputs, text_head_mask=keep_text * 1.0, vision_head_mask=keep_vision * 1.0)
    assert_close(run(small, **inputs).logits_per_image, masked.logits_per_image)


def test_compact_refuses_a_keep_mask_of_the_wrong_shape(bert):
    model, _ = bert
    with pytest.raises(ValueError, match=r"keep mask has shapes .* encoder has \[4, 4, 4\] heads"):
        compact(model, np.ones((L, N + 1), bool))


def test_compact_refuses_scores_passed_as_a_keep_mask(bert):
    """Scores in place of `keep_mask(scores, ...)` would keep every non-zero head."""
    model, _ = bert
    with pytest.raises(ValueError, match=r"keep mask must be boolean \(or 0/1\).*keep_mask"):
        compact(model, np.random.default_rng(0).random((L, N)))
    assert compact(model, np.ones((L, N), np.int32)).config == model.config  # 0/1 is a mask
    with pytest.raises(ValueError, match=r"head_sets must be \[M, L, N\], got shape \(3, 4\)"):
        members_from(model, np.ones((L, N), bool))


def test_compacted_model_exports_through_zero_heads(bert, tmp_path):
    model, batch = bert
    small = compact(model, random_keep(7, L, N))
    full = expand_to_full(small)
    assert full.config.encoder.num_heads == (N,) * L
    assert_close(full(**batch).logits, small(**batch).logits)
    hj.save_pretrained(full, tmp_path)
    assert_close(hj.from_pretrained(tmp_path)(**batch).logits, small(**batch).logits)
