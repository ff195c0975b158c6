"""Model behaviour that needs no reference implementation: gradients, shapes, transforms."""

from __future__ import annotations

import dataclasses
import functools
import logging
import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.models import (
    BertConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    EncoderConfig,
    ViTConfig,
)
from hydra_jax.testing import assert_close

L, N, K = 2, 3, 4  # distinct, so a swapped axis fails instead of broadcasting
TINY = BertConfig(
    testing.encoder(layers=L, heads=N, head_dim=K, mlp_dim=17),
    vocab_size=23, max_positions=9, type_vocab_size=2, num_labels=5,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny():
    model = hj.Model.init(TINY, jax.random.key(0))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 23, (6, 7))
    mask = (np.arange(7)[None] < np.array([7, 5, 2, 7, 3, 6])[:, None]).astype(np.int32)
    labels = rng.integers(0, 5, 6)
    return model, dict(input_ids=ids * mask, attention_mask=mask, labels=labels)


def loss_fn(model, params, head_mask, batch):
    logits = model.apply(params, **batch, head_mask=head_mask).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()


def test_init_runs_only_the_initialisers_and_gives_flaxs_weights():
    """`Model.init` traces the dummy forward pass instead of running it (`lazy_init`); its
    weights are those of Flax's eager `init`, which runs that pass, bit for bit (a ViT's
    truncated-normal CLS token and positions too, which a jitted init rounds differently)."""
    vit = testing.vit(layers=1, heads=2, head_dim=3, mlp_dim=5, image_size=4, patch_size=2)
    for config in (TINY, vit):
        key = jax.random.key(0)
        module = hj.models.model.module_of(config)
        eager = module.init(key, **hj.models.architectures.dummy_inputs(config))["params"]
        chex.assert_trees_all_equal(hj.Model.init(config, key).params, eager)


def test_head_mask_gradient_matches_float64_finite_differences(tiny):
    model, batch = tiny
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), model.params)
        mask = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.0, (L, N)), jnp.float64)
        loss = jax.jit(functools.partial(loss_fn, model, params, batch=batch))
        grad = np.asarray(jax.grad(loss)(mask))
        eps = 1e-6
        numeric = np.zeros((L, N))
        for l in range(L):
            for h in range(N):
                e = jnp.zeros((L, N), jnp.float64).at[l, h].set(eps)
                numeric[l, h] = (loss(mask + e) - loss(mask - e)) / (2 * eps)
    assert grad.dtype == np.float64
    assert np.abs(grad).max() > 1e-4  # the mask matters
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)


def test_jit_and_vmap_over_head_masks_match_eager(tiny):
    model, batch = tiny
    masks = jnp.asarray(np.random.default_rng(2).integers(0, 2, (4, L, N)), jnp.float32)
    forward = jax.jit(lambda p, m: model.apply(p, **batch, head_mask=m).logits)
    stacked = jax.vmap(forward, in_axes=(None, 0))(model.params, masks)  # [M, B, C]
    assert stacked.shape == (4, 6, 5)
    for m in range(4):
        eager = model(**batch, head_mask=masks[m]).logits
        assert_close(stacked[m], eager)  # a vmapped program vs one call at a time


def test_a_call_outside_jit_compiles_one_program(caplog):
    """`model(**batch)` on concrete arrays runs the forward pass as one compiled program (op by
    op, each of its hundreds of operations would compile on its own)."""
    config = dataclasses.replace(TINY, num_labels=7)  # a config no other test compiles
    model = hj.Model.init(config, jax.random.key(3))
    ids = np.arange(1, 16).reshape(3, 5)
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        logits = model(input_ids=ids, attention_mask=np.ones_like(ids)).logits
    compiled = re.findall(r"Compiling (\S+) with", caplog.text)
    assert compiled == ["jit(_forward)"], compiled
    assert logits.shape == (3, 7)


def test_a_call_under_an_interceptor_or_a_trace_is_traced_anew(tiny):
    """A Flax interceptor acts while a forward pass is traced: an eager call under one is not
    served from the program an earlier call compiled. Under `jit` the forward pass is traced
    into the caller's program, not called as a compiled program of its own."""
    model, batch = tiny

    def silence_classifier(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        return jnp.zeros_like(out) if context.module.name == "classifier" else out

    assert np.abs(model(**batch).logits).min() > 0
    with nn.intercept_methods(silence_classifier):
        assert np.all(model(**batch).logits == 0)
    jaxpr = jax.make_jaxpr(lambda p: model.apply(p, **batch).logits)(model.params)
    assert "_forward" not in str(jaxpr)


def test_all_ones_mask_equals_no_mask(tiny):
    model, batch = tiny
    assert_close(model(**batch, head_mask=jnp.ones((L, N))).logits, model(**batch).logits)


def test_attention_probabilities_ignore_padding(tiny):
    model, batch = tiny
    probs = np.asarray(model(**batch, output_attentions=True).attentions)  # [L, B, N, T, S]
    assert probs.shape == (L, 6, N, 7, 7)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)  # 7 float32 terms: <= 7 ulp
    padding = batch["attention_mask"] == 0  # [B, S]
    assert np.all(probs.transpose(1, 4, 0, 2, 3)[padding] == 0.0)


def test_dropout_rng_turns_dropout_on(tiny):
    model, batch = tiny
    config = TINY.encoder
    assert config.dropout == 0.0  # the preset has none; use a copy that has some
    noisy = hj.Model(
        BertConfig(
            EncoderConfig(config.num_heads, config.width, K, 17, "gelu", 1e-12, False, dropout=0.3),
            vocab_size=23, max_positions=9, type_vocab_size=2, num_labels=5,
        ),
        model.params,
    )  # fmt: skip
    a = noisy.apply(noisy.params, **batch, dropout_rng=jax.random.key(0)).logits
    b = noisy.apply(noisy.params, **batch, dropout_rng=jax.random.key(1)).logits
    assert not np.allclose(a, b)
    assert_close(noisy(**batch).logits, model(**batch).logits)  # dropout off at inference


@pytest.mark.parametrize(
    "mask", [np.ones((N, L)), np.ones((L, N + 1)), np.ones(L * N), [np.ones(N)] * (L + 1)]
)
def test_head_mask_of_wrong_shape_is_refused(tiny, mask):
    model, batch = tiny
    with pytest.raises(ValueError, match=r"head_mask has shape .* expected shape \(2, 3\)"):
        model(**batch, head_mask=mask)


def test_empty_and_all_padding_batches_are_refused(tiny):
    model, batch = tiny
    with pytest.raises(ValueError, match=r"empty batch: input_ids has shape \(0, 7\)"):
        model(input_ids=np.zeros((0, 7), np.int32))
    mask = batch["attention_mask"].copy()
    mask[[1, 4]] = 0
    with pytest.raises(ValueError, match=r"examples \[1, 4\] of the batch are all padding"):
        model(**{**batch, "attention_mask": mask})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: {**b, "input_ids": b["input_ids"] + 22},
         r"input_ids must lie in \[0, 23\) \(the vocabulary\); \d+ do not, e\.g\. \d+ at"),
        (lambda b: {**b, "input_ids": b["input_ids"] - 1},  # padding 0 becomes -1
         r"input_ids must lie in \[0, 23\).*e\.g\. -1 at \(1, 5\)"),
        (lambda b: {**b, "token_type_ids": np.full_like(b["input_ids"], 2)},
         r"token_type_ids must lie in \[0, 2\) \(the token types\)"),
        (lambda b: {**b, "input_ids": np.ones((6, 10), int), "attention_mask": np.ones((6, 10))},
         r"input_ids has 10 tokens, more than the model's 9 positions"),
        (lambda b: {**b, "attention_mask": b["attention_mask"][:, :5]},
         r"attention_mask has shape \(6, 5\), input_ids has \(6, 7\)"),
        (lambda b: {"input_ids": b["input_ids"][0]}, r"must be \[B, T\], got shape \(7,\)"),
        (lambda b: {**b, "input_ids": b["input_ids"] + 0.0}, r"input_ids must be integers"),
        (lambda b: {**b, "head_mask": np.full((L, N), np.nan)}, r"head_mask contains NaN/inf"),
        (lambda b: {**b, "input_ids": b["input_ids"][:, :0], "attention_mask": None},
         r"input_ids has no tokens \(shape \(6, 0\)\)"),
        (lambda b: {**b, "attention_mask": b["attention_mask"] * 2},
         r"attention_mask must be 0 \(padding\) or 1 \(a token\); it holds \[0, 2\]"),
    ],
)  # fmt: skip
def test_bad_token_inputs_are_refused_before_they_reach_jit(tiny, edit, message):
    model, batch = tiny
    with pytest.raises(ValueError, match=message):
        model(**edit(batch))


def test_bad_pixel_layout_and_size_are_named():
    vit = hj.Model.init(
        ViTConfig(
            testing.encoder(layers=1, heads=2, head_dim=4, mlp_dim=11, pre_norm=True), 6, 3, 2
        ),
        jax.random.key(0),
    )
    assert vit(pixel_values=np.zeros((1, 2, 6, 6), np.float32)).last_hidden_state.shape == (1, 5, 8)
    with pytest.raises(ValueError, match=r"channels last \(NHWC\); this model takes \[B, C, H, W\] "
                       r"= \[B, 2, 6, 6\]"):  # fmt: skip
        vit(pixel_values=np.zeros((1, 6, 6, 2), np.float32))
    with pytest.raises(ValueError, match=r"pixel_values has shape \(1, 2, 9, 9\); this model"):
        vit(pixel_values=np.zeros((1, 2, 9, 9), np.float32))
    with pytest.raises(ValueError, match=r"pixel_values are uint8.*AutoImageProcessor"):
        vit(pixel_values=np.full((1, 2, 6, 6), 200, np.uint8))
    with pytest.raises(ValueError, match=r"pixel_values contain NaN/inf"):
        vit(pixel_values=np.full((1, 2, 6, 6), np.inf, np.float32))


def test_unknown_input_is_refused(tiny):
    model, batch = tiny
    with pytest.raises(TypeError, match=r"unexpected inputs \['pixel_values'\]"):
        model(**batch, pixel_values=np.zeros((1, 3, 4, 4)))


@pytest.mark.parametrize("num_labels", [0, -1, 2.5, True])
def test_with_classifier_refuses_a_class_count_that_is_not_positive(tiny, num_labels):
    model, _ = tiny
    with pytest.raises(ValueError, match=r"num_labels must be a positive integer"):
        hj.with_classifier(model, num_labels, jax.random.key(0))


def param_count(config) -> int:
    shapes = jax.eval_shape(lambda: hj.Model.init(config, jax.random.key(0)).params)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def base_encoder(D, N, L, F, act, eps, pre_norm):
    return EncoderConfig((N,) * L, D, D // N, F, act, eps, pre_norm)


def test_real_size_parameter_counts_match_transformers():
    """Counts of `transformers` BertModel(), ViTModel(), CLIPModel() defaults and MiniLM-L6."""
    bert_base = BertConfig(base_encoder(768, 12, 12, 3072, "gelu", 1e-12, False), 30522, 512, 2)
    minilm = BertConfig(base_encoder(384, 12, 6, 1536, "gelu", 1e-12, False), 30522, 512, 2)
    vit_base = ViTConfig(base_encoder(768, 12, 12, 3072, "gelu", 1e-12, True), 224, 16)
    clip_b32 = CLIPConfig(
        CLIPTextConfig(base_encoder(512, 8, 12, 2048, "quick_gelu", 1e-5, True), 49408, 77, 2),
        CLIPVisionConfig(base_encoder(768, 12, 12, 3072, "quick_gelu", 1e-5, True), 224, 32),
        projection_dim=512,
    )
    assert param_count(bert_base) == 109_482_240
    assert param_count(minilm) == 22_713_216
    assert param_count(vit_base) == 86_389_248
    assert param_count(clip_b32) == 151_277_313


def test_minilm_checkpoint_loads_with_expected_structure():
    model = hj.from_pretrained(hj.minilm_l6_path())
    assert model.config.encoder.num_heads == (12,) * 6
    assert model.config.encoder.head_dim == 32
    q = model.params["encoder"]["layer_0"]["attention"]["query"]["kernel"]
    o = model.params["encoder"]["layer_0"]["attention"]["out"]["kernel"]
    assert q.shape == (384, 12, 32) and o.shape == (12, 32, 384)
    # On the device, not host arrays that every jitted call would copy there again.
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(model.params))
