"""The dtype policy: bf16 dense products with fp32 parameters, softmax, LayerNorm statistics,
logits and losses, and hidden states in fp32 or bf16; bf16 outputs within a stated tolerance of
fp32 for BERT, ViT and the fused Hydra."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.ensembles.efficient import batch_ensemble, lora_ensemble, packed_ensemble
from hydra_jax.heads import his_and_entropy
from hydra_jax.models import BertConfig, with_classifier, with_dtype
from hydra_jax.models.dense import Dense, lecun_normal, narrow_dot, wide_dot
from hydra_jax.training import TrainSettings, TrainState, make_optimizer, make_train_step

pytestmark = pytest.mark.slow  # many compiled programs (`make test-fast` leaves it out)

# bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); after a few layers of matmuls
# the logits of these tiny models differ from fp32 by 1-3% of their range (measured: 0.4 to
# 2.6%). The bound leaves room over that and still fails for a wrong cast (an fp16 or int
# overflow, a bias in the wrong dtype, a softmax in bf16 over -inf padding).
LOGIT_TOLERANCE = 0.04  # of max |fp32 logit|
BF16_ULP = 2.0**-8  # bf16 keeps 8 significant bits: one rounding step relative to a value

L, N, K = 3, 4, 5  # distinct: a swapped axis fails instead of broadcasting
BERT = BertConfig(
    testing.encoder(layers=L, heads=N, head_dim=K, mlp_dim=22),
    vocab_size=29, max_positions=12, type_vocab_size=2,
)  # fmt: skip
VIT = testing.vit(layers=L, heads=N, head_dim=3, mlp_dim=14, layer_norm_eps=1e-6, num_channels=2,
                  num_labels=3)  # fmt: skip


def relative_error(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def bert():
    # Weights twice the init, so heads differ; at 3x a compacted member is so ill-conditioned
    # that rounding its weights to bf16 alone moves its fp32 logits by 18% (a property of the
    # weights, not of the policy).
    model = with_classifier(hj.Model.init(BERT, jax.random.key(0)), 2, jax.random.key(1))
    model = testing.sharpened(model, 2.0)
    rng = np.random.default_rng(0)
    mask = (np.arange(9)[None] < rng.integers(2, 10, (6, 1))).astype(np.int32)
    batch = dict(input_ids=rng.integers(1, 29, (6, 9)) * mask, attention_mask=mask,
                 labels=rng.integers(0, 2, 6))  # fmt: skip
    return model, batch


@pytest.fixture(scope="module")
def vit():
    model = hj.Model.init(VIT, jax.random.key(2))
    rng = np.random.default_rng(1)
    batch = dict(pixel_values=rng.normal(size=(5, 2, 8, 8)).astype(np.float32),
                 labels=rng.integers(0, 3, 5))  # fmt: skip
    return model, batch


def test_unknown_compute_dtype_is_refused():
    with pytest.raises(ValueError, match="compute dtype 'float16' is not one of"):
        testing.encoder(layers=1, heads=2, head_dim=2, mlp_dim=6, dtype="float16")


def test_a_hidden_dtype_other_than_fp32_or_the_compute_dtype_is_refused():
    with pytest.raises(ValueError, match="hidden dtype 'bfloat16' is neither float32 nor"):
        testing.encoder(layers=1, heads=2, head_dim=2, mlp_dim=6, hidden_dtype="bfloat16")


def dot_operand_dtypes(model: hj.Model, inputs: dict) -> list[tuple[str, str]]:
    """The operand dtypes of every product in `model`'s forward."""
    jaxpr = jax.make_jaxpr(lambda p: model.apply(p, **inputs))(model.params)
    found = []

    def walk(jaxpr: jax.extend.core.Jaxpr) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(tuple(str(v.aval.dtype) for v in eqn.invars))
        for sub in jax.extend.core.subjaxprs(jaxpr):
            walk(sub)

    walk(jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("hidden", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["bert", "vit"])
def test_bf16_compute_keeps_fp32_where_the_policy_says(family, hidden, request):
    model, batch = request.getfixturevalue(family)
    low = with_dtype(model, "bfloat16", hidden)
    assert low.params is model.params  # the same fp32 weights
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    out = low(**inputs, output_attentions=True)
    assert out.last_hidden_state.dtype == jnp.dtype(hidden)  # hidden states
    assert out.logits.dtype == jnp.float32
    assert out.attentions.dtype == jnp.float32  # softmax in fp32
    np.testing.assert_allclose(np.asarray(out.attentions).sum(-1), 1.0, atol=1e-5)
    # every layer's q, k, v, output and two MLP products multiply bf16 operands; with fp32
    # hidden states nothing else does (the attention's two products, the heads)
    dots = dot_operand_dtypes(low, inputs)
    narrow = [d for d in dots if d == ("bfloat16", "bfloat16")]
    assert len(narrow) == (L * 6 if hidden == "float32" else len(dots) - 1), dots  # - classifier
    if hidden == "float32":
        assert all(d == ("float32", "float32") for d in dots if d not in narrow), dots


@pytest.mark.parametrize("hidden", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["bert", "vit"])
def test_bf16_logits_are_within_tolerance_of_fp32(family, hidden, request):
    model, batch = request.getfixturevalue(family)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    full = model(**inputs).logits
    low = with_dtype(model, "bfloat16", hidden)(**inputs).logits
    error = relative_error(low, full)
    assert 0 < error <= LOGIT_TOLERANCE, error  # 0 would mean bf16 never ran


def test_bf16_fused_hydra_is_within_tolerance_of_fp32(bert):
    model, batch = bert
    kept = np.array([[[0, 1], [1, 2], [2, 3]], [[2, 3], [0, 3], [0, 1]]])  # [M, L, 2] indices
    head_sets = np.zeros((2, L, N), bool)  # [M, L, N]
    np.put_along_axis(head_sets, kept, True, axis=-1)
    members = hj.hydra.members_from(model, head_sets)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    fused = hj.hydra.fuse(members)
    full = fused(**inputs).logits  # [B, M, C]
    # bf16 hidden states: fp32 ones move member 0's small logits (|logit| <= 0.3) by 5%, as
    # rounding only the dense layers' operands does (`test_bf16_products_are_...` below)
    low_model = with_dtype(fused, "bfloat16", "bfloat16")
    low = low_model(**inputs).logits
    assert low.dtype == jnp.float32 and low.shape == full.shape
    assert 0 < relative_error(low, full) <= LOGIT_TOLERANCE
    # Fusing bf16 members gives the bf16 fused network (the policy commutes with fusion), and
    # in bf16 too the fused network equals its members run alone, to bf16 rounding: the two
    # programs accumulate in float32 in their own order, so a value near a bf16 rounding boundary
    # may round either way (one bf16 ulp, 2**-8 = 0.4%). A wrong member moves logits by O(1).
    refused = hj.hydra.fuse([with_dtype(m, "bfloat16", "bfloat16") for m in members])
    assert refused.config == low_model.config
    alone = np.stack(
        [with_dtype(m, "bfloat16", "bfloat16")(**inputs).logits for m in members], axis=1
    )
    assert relative_error(low, alone) <= BF16_ULP


def rounded_dense_operands(model: hj.Model, inputs: dict) -> jax.Array:
    """`model`'s fp32 logits with the inputs and kernels of its encoder's dense layers rounded
    to bf16: what bf16 products with fp32 hidden states compute, up to the order of sums."""

    def round_input(next_fun, args, kwargs, context):
        if isinstance(context.module, Dense) and context.method_name == "__call__":
            args = tuple(x.astype(jnp.bfloat16).astype(jnp.float32) for x in args)
        return next_fun(*args, **kwargs)

    def round_kernel(path, w):
        keys = [str(getattr(k, "key", "")) for k in path]
        if keys[-1] == "kernel" and "encoder" in keys:
            return w.astype(jnp.bfloat16).astype(jnp.float32)
        return w

    params = jax.tree_util.tree_map_with_path(round_kernel, model.params)
    with nn.intercept_methods(round_input):
        return model.apply(params, **inputs).logits


def test_bf16_products_are_fp32_arithmetic_on_rounded_dense_operands(bert):
    model, batch = bert
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    kept = np.array([[[0, 1], [1, 2], [2, 3]], [[2, 3], [3, 0], [0, 1]]])  # [M, L, 2]
    head_sets = np.zeros((2, L, N), bool)
    np.put_along_axis(head_sets, kept, True, axis=-1)
    for m in (model, hj.hydra.fuse(hj.hydra.members_from(model, head_sets))):
        want = rounded_dense_operands(m, inputs)
        got = with_dtype(m, "bfloat16")(**inputs).logits
        # the same products of the same rounded numbers, summed in float32 in each kernel's
        # order; rounding the hidden states or the products' outputs would be off by ~1e-2
        assert relative_error(got, want) <= 1e-5, relative_error(got, want)


def test_bf16_training_step_keeps_fp32_master_weights(bert):
    model, batch = bert
    settings = TrainSettings(epochs=1, batch_size=6, learning_rate=1e-3, warmup_fraction=0.0)
    optimizer = make_optimizer(settings, total_steps=4)
    key = jax.random.key(3)
    results = {}
    for dtype, hidden in (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16",) * 2):
        m = with_dtype(model, dtype, hidden)
        state = TrainState.create(m.params, optimizer)
        state, metrics = make_train_step(m, optimizer)(state, dict(batch), key)
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
        results[dtype, hidden] = (state.params, float(metrics["loss"]))

    # The first Adam update is lr * sign(grad) almost everywhere: bf16 gradients agree in sign.
    def update(params):
        return np.concatenate([np.ravel(a - b) for a, b in zip(
            jax.tree.leaves(params), jax.tree.leaves(model.params), strict=True)])  # fmt: skip

    p32, loss32 = results.pop(("float32", "float32"))
    delta32 = update(p32)
    for p16, loss16 in results.values():
        assert abs(loss16 - loss32) <= 0.02 * abs(loss32)
        delta16 = update(p16)
        cosine = delta32 @ delta16 / np.linalg.norm(delta32) / np.linalg.norm(delta16)
        assert cosine > 0.9, cosine


def test_bf16_gradients_of_the_efficient_kinds_follow_fp32(vit):
    """BatchEnsemble and LoRA-Ensemble intercept every dense layer; in bf16 their gradients go
    through the layers' own backward pass (`narrow_dot`) and still point where fp32's do."""
    model, batch = vit
    labels, inputs = batch["labels"], {k: v for k, v in batch.items() if k != "labels"}
    for ensemble in (batch_ensemble(model, 2, jax.random.key(5)),
                     lora_ensemble(model, 2, jax.random.key(6), rank=2)):  # fmt: skip
        grads = {}
        for dtype in ("float32", "bfloat16"):
            m = with_dtype(ensemble, dtype)

            def loss(params, m=m):
                logits = m.apply(params, **inputs).logits  # [B, M, C]
                labels_m = jnp.broadcast_to(labels[:, None], logits.shape[:2])
                return optax.softmax_cross_entropy_with_integer_labels(logits, labels_m).mean()

            grads[dtype] = jax.jit(jax.grad(loss))(m.params)
        # the encoder's dense layers are adapted (intercepted), and their adapters train in bf16
        # where they do in fp32 (LoRA's first factors start with no gradient: B = 0)
        trains = {
            dtype: [bool(np.any(g != 0)) for g in
                    jax.tree.leaves(grads[dtype]["members"]["adapters"]["encoder"])]
            for dtype in grads
        }  # fmt: skip
        assert any(trains["float32"]) and trains["bfloat16"] == trains["float32"]
        g32, g16 = (np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads[d])])
                    for d in ("float32", "bfloat16"))  # fmt: skip
        assert np.all(np.isfinite(g16))
        assert g32 @ g16 / np.linalg.norm(g32) / np.linalg.norm(g16) > 0.99


def test_bf16_gradients_of_a_packed_ensemble_follow_fp32_in_both_modes():
    """Packed Ensembles replace the encoder's dense layers by grouped products (two groups
    here), which take the layers' compute and output dtypes."""
    config = testing.vit(layers=2, heads=3, head_dim=8, mlp_dim=20, layer_norm_eps=1e-6,
                         num_channels=2, num_labels=3)  # fmt: skip
    packed = packed_ensemble(config, 2, jax.random.key(7), alpha=2.0, groups=2)
    rng = np.random.default_rng(4)
    pixels = rng.normal(size=(3, 2, 8, 8)).astype(np.float32)
    labels = np.array([0, 2, 1])
    grads, hidden_states = {}, {}
    for spec in (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")):
        m = with_dtype(packed, *spec)
        hidden_states[spec] = m(pixel_values=pixels).last_hidden_state.dtype

        def loss(params, m=m):
            logits = m.apply(params, pixel_values=pixels).logits  # [B, M, C]
            labels_m = jnp.broadcast_to(labels[:, None], logits.shape[:2])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels_m).mean()

        grads[spec] = np.concatenate(
            [np.ravel(g) for g in jax.tree.leaves(jax.jit(jax.grad(loss))(m.params))]
        )
    assert [hidden_states[s] for s in grads] == [jnp.float32, jnp.float32, jnp.bfloat16]
    g32 = grads.pop(("float32", "float32"))
    for g16 in grads.values():
        assert np.all(np.isfinite(g16)) and np.any(g16 != g32)  # bf16 ran
        assert g32 @ g16 / np.linalg.norm(g32) / np.linalg.norm(g16) > 0.99


def test_bf16_head_scores_rank_heads_as_fp32(bert):
    model, batch = bert
    his32, ae32 = his_and_entropy(model, [batch])
    his16, ae16 = his_and_entropy(with_dtype(model, "bfloat16"), [batch])
    np.testing.assert_allclose(ae16, ae32, rtol=0.02)
    rank = lambda x: np.argsort(np.argsort(x.ravel()))  # noqa: E731
    assert np.corrcoef(rank(his16), rank(his32))[0, 1] > 0.9


def test_loss_of_bf16_logits_is_computed_in_fp32(bert):
    model, batch = bert
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = with_dtype(model, "bfloat16")(**inputs).logits
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    assert loss.dtype == jnp.float32


def test_dense_products_of_bf16_accumulate_in_fp32_and_round_once():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((6, 33)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((33, 3, 5)), jnp.bfloat16)
    dims = (((1,), (0,)), ((), ()))
    got = jax.jit(lambda x, w: wide_dot(x, w, dims))(x, w)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    exact = np.einsum("md,dnk->mnk", x64, w64)
    assert got.dtype == jnp.bfloat16
    # One rounding of a float32 sum to bf16 (half a step: at most 2^-8 of the value), plus the
    # float32 sum's own error, whatever order a CPU's kernel sums in (at most K float32 steps of
    # the sum of |terms|); a bf16 accumulation of 33 terms would be off by several bf16 steps.
    K, f32_step = x.shape[1], 2.0**-24
    sum_error = K * f32_step * np.einsum("md,dnk->mnk", np.abs(x64), np.abs(w64))
    bound = BF16_ULP * np.abs(exact) + (1 + BF16_ULP) * sum_error
    assert np.all(np.abs(np.asarray(got, np.float64) - exact) <= bound)
    # float32 operands take the plain product: the same program as `dot_general`'s
    x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
    wide = jax.jit(lambda a, b: wide_dot(a, b, dims)).lower(x32, w32).as_text()
    plain = jax.jit(lambda a, b: jax.lax.dot_general(a, b, dims)).lower(x32, w32).as_text()
    assert wide == plain


# Dense layers' products: Dense `[R, C] x [C, O]`, a q/k/v projection `[R, D] x [D, N, K]`, an
# output projection `[R, N, K] x [N, K, D]`, its axes paired out of order, and a pruned kernel.
NARROW_PRODUCTS = [
    ((6, 33), (33, 7), (((1,), (0,)), ((), ()))),
    ((6, 9), (9, 3, 5), (((1,), (0,)), ((), ()))),
    ((6, 3, 5), (3, 5, 4), (((1, 2), (0, 1)), ((), ()))),
    ((6, 5, 3), (3, 5, 4), (((2, 1), (0, 1)), ((), ()))),
    ((6, 9), (9, 0, 5), (((1,), (0,)), ((), ()))),
]


@pytest.mark.parametrize(("lhs_shape", "rhs_shape", "dims"), NARROW_PRODUCTS)
def test_gradients_of_bf16_dense_products_are_jaxs_up_to_the_order_of_sums(
    lhs_shape, rhs_shape, dims
):
    rng = np.random.default_rng(1)
    x, w = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in (lhs_shape, rhs_shape))

    def reference(a, b):  # JAX's own backward pass: float32 cotangent, float32 products
        out = jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
        return out.astype(jnp.bfloat16)

    out, backward = jax.vjp(lambda a, b: wide_dot(a, b, dims), x, w)
    ref, ref_backward = jax.vjp(reference, x, w)
    cotangent = jnp.asarray(rng.standard_normal(out.shape), jnp.bfloat16)
    pairs = [(out, ref), *zip(backward(cotangent), ref_backward(cotangent), strict=True)]
    for got, want in pairs:
        assert got.dtype == want.dtype == jnp.bfloat16 and got.shape == want.shape
        # float32 sums in another order, each rounded once to bf16: one bf16 step apart at most
        # (a transposed or mispaired axis is off by O(1))
        want = np.asarray(want, np.float64)
        scale = np.abs(want) + 2.0**-16 * max(1.0, np.abs(want).max(initial=0))
        assert np.all(np.abs(np.asarray(got, np.float64) - want) <= BF16_ULP * scale)


@pytest.mark.parametrize(("lhs_shape", "rhs_shape", "dims"), NARROW_PRODUCTS[2:4])
def test_gradients_of_a_kept_float32_product_are_jaxs_to_bf16_resolution(
    lhs_shape, rhs_shape, dims
):
    """bf16 products with fp32 hidden states: the cotangent is float32, rounded for the input's
    gradient only (invisible in the bf16 gradients returned)."""
    rng = np.random.default_rng(3)
    x, w = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in (lhs_shape, rhs_shape))
    out, backward = jax.vjp(lambda a, b: narrow_dot(a, b, dims, None), x, w)
    assert out.dtype == jnp.float32
    cotangent = jnp.asarray(rng.standard_normal(out.shape), jnp.float32)
    d_x, d_w = backward(cotangent)

    def reference(a, b):
        return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)

    x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
    _, ref_backward = jax.vjp(reference, x32, w32)
    _, abs_backward = jax.vjp(reference, jnp.abs(x32), jnp.abs(w32))  # sums of |terms|
    wants, terms = ref_backward(cotangent), abs_backward(jnp.abs(cotangent))
    for got, want, term in zip((d_x, d_w), wants, terms, strict=True):
        assert got.dtype == jnp.bfloat16 and got.shape == want.shape
        # the cotangent rounded (half a bf16 step of each term), then the result (half a step
        # of it); a mispaired axis is off by O(1)
        want, term = np.asarray(want, np.float64), np.asarray(term, np.float64)
        bound = BF16_ULP * (np.abs(want) + term) + 2.0**-20 * term
        assert np.all(np.abs(np.asarray(got, np.float64) - want) <= bound)


def test_the_input_gradient_of_a_bf16_dense_product_multiplies_bf16_operands():
    x = jnp.ones((8, 9), jnp.bfloat16)
    w = jnp.ones((9, 3, 5), jnp.bfloat16)
    dims = (((1,), (0,)), ((), ()))
    grad = jax.grad(lambda a: wide_dot(a, w, dims).astype(jnp.float32).sum())
    hlo = jax.jit(grad).lower(x).as_text()
    # the cotangent [8, 3, 5] against the kernel over its outputs, in bf16, summed in float32
    assert "tensor<8x3x5xbf16>, tensor<9x3x5xbf16>) -> tensor<8x9xf32>" in hlo, hlo


# Flax's layer each `Dense` stands for: Dense `[R, C] -> [R, O]`, a q/k/v projection to (N, K)
# heads, an output projection over (N, K), a layer pruned to no heads (Flax's initialiser
# divides by its zero fan-out: ours gives zeros).
FLAX_LAYERS = [
    ((6, 33), dict(features=7), nn.Dense(7)),
    ((6, 9), dict(features=(3, 5)), nn.DenseGeneral((3, 5))),
    ((6, 3, 5), dict(features=4, axis=(-2, -1)), nn.DenseGeneral(4, axis=(-2, -1))),
    ((6, 9), dict(features=(0, 5)), nn.DenseGeneral((0, 5), kernel_init=lecun_normal)),
]


@pytest.mark.parametrize(("shape", "ours", "flax_layer"), FLAX_LAYERS)
def test_dense_is_flaxs_layer_in_float32_and_rounds_once_in_bf16(shape, ours, flax_layer):
    x = jnp.asarray(np.random.default_rng(2).standard_normal(shape), jnp.float32)
    layer = Dense(**ours)
    params = layer.init(jax.random.key(4), x)
    flax_params = flax_layer.init(jax.random.key(4), x)
    jax.tree.map(np.testing.assert_array_equal, params, flax_params)  # names, shapes, values
    if "bias" in params["params"]:  # a nonzero bias, to see where it is added
        params["params"]["bias"] = jnp.linspace(-3, 3, params["params"]["bias"].size).reshape(
            params["params"]["bias"].shape
        )
    testing.assert_close(layer.apply(params, x), flax_layer.apply(params, x))
    low = Dense(**ours, dtype=jnp.bfloat16).apply(params, x)
    assert low.dtype == jnp.bfloat16
    # the float32 product of the bf16 operands plus the float32 bias, rounded once: within half
    # a bf16 step (2^-8 of the value) of the exact value, plus the float32 sum's own error in
    # any summation order (C + 1 float32 steps of the sum of |terms|)
    R, C = x.shape[0], math.prod(x.shape[1:])
    x64 = np.asarray(x.astype(jnp.bfloat16), np.float64).reshape(R, C)
    kernel64 = np.asarray(params["params"]["kernel"].astype(jnp.bfloat16), np.float64)
    kernel64 = kernel64.reshape(C, -1)
    bias64 = np.asarray(params["params"].get("bias", np.zeros(1)), np.float64).reshape(-1)
    exact = x64 @ kernel64 + bias64
    sum_error = (C + 1) * 2.0**-24 * (np.abs(x64) @ np.abs(kernel64) + np.abs(bias64))
    bound = (BF16_ULP * np.abs(exact) + (1 + BF16_ULP) * sum_error).reshape(low.shape)
    exact = exact.reshape(low.shape)
    assert np.all(np.abs(np.asarray(low, np.float64) - exact) <= bound)
    # with a float32 output nothing is rounded after the product: the float32 sum's error only
    kept = Dense(**ours, dtype=jnp.bfloat16, out_dtype=jnp.float32).apply(params, x)
    assert kept.dtype == jnp.float32
    assert np.all(np.abs(np.asarray(kept, np.float64) - exact) <= sum_error.reshape(low.shape))
    # Flax's layer rounds the product, adds the rounded bias and rounds again: off by more
    if low.size:
        flax_low = flax_layer.clone(dtype=jnp.bfloat16).apply(params, x)
        assert np.any(np.abs(np.asarray(flax_low, np.float64) - exact) > bound)
