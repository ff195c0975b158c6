"""The native attention kernels (hydra_jax/native): values and gradients against a float64 numpy
reference written out by hand, where the models use them, and how they are built."""

from __future__ import annotations

import ctypes
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hydra_jax import native
from hydra_jax.models.attention import Attention
from hydra_jax.models.sharding import make_mesh
from hydra_jax.native import attention as na


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray):
    """softmax(q k^T) v and its gradients for the cotangent `g`, in float64 numpy."""
    q, k, v, g = (x.astype(np.float64) for x in (q, k, v, g))
    logits = q @ np.swapaxes(k, -1, -2)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return p @ v, ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


def xla(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2), axis=-1) @ v


def kernel_pass(q, k, v, g):
    """The kernels' output (the forward under differentiation) and gradients dq, dk, dv."""
    out, vjp = jax.vjp(lambda q, k, v: na.attend(xla, q, k, v), q, k, v)
    return (out, *vjp(g))


@pytest.fixture(scope="module")
def built() -> None:
    if not na.load("attention"):
        pytest.fail("the native attention kernel did not build on this machine")


def draws(shape_q, shape_kv, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q).astype(np.float32)
    k, v = (rng.standard_normal(shape_kv).astype(np.float32) for _ in range(2))
    return q, k, v, rng.standard_normal(shape_q).astype(np.float32)


# [..., T, K] queries against [..., S, K] keys: odd and padded lengths, one query, one key,
# width 1, several leading axes.
SHAPES = [
    ((2, 3, 5, 4), (2, 3, 5, 4)),
    ((1, 12, 50, 6), (1, 12, 50, 6)),
    ((2, 2, 16, 8), (2, 2, 16, 8)),
    ((3, 1, 1, 8), (3, 1, 1, 8)),
    ((2, 3, 7, 4), (2, 3, 11, 4)),
    ((2, 2, 9, 1), (2, 2, 1, 1)),
    ((2, 2, 3, 5, 2), (2, 2, 3, 5, 2)),
    ((2, 2, 9, 24), (2, 2, 13, 24)),  # wider than MAX_HEAD_DIM: the width as a variable
]


@pytest.mark.parametrize(("shape_q", "shape_kv"), SHAPES, ids=str)
def test_kernels_match_the_float64_reference(built, shape_q, shape_kv):
    q, k, v, g = draws(shape_q, shape_kv)
    got = jax.jit(kernel_pass)(q, k, v, g)
    # float32 rounding: about 2.5 units of the largest value's last place per key summed
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, reference(q, k, v, g), strict=True):
        scale = np.abs(b).max()
        np.testing.assert_allclose(a, b, rtol=0, atol=1.5e-7 * scale * shape_kv[-2], err_msg=name)


def test_the_reference_is_xlas_gradient(built):
    q, k, v, g = draws((2, 3, 7, 4), (2, 3, 11, 4), seed=1)
    out, vjp = jax.vjp(xla, q, k, v)
    for a, b in zip((out, *vjp(g)), reference(q, k, v, g), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


def test_not_differentiated_it_is_the_reference(built):
    q, k, v, _ = draws((2, 3, 5, 4), (2, 3, 5, 4))
    ours = jax.jit(lambda q, k, v: na.attend(xla, q, k, v))
    assert np.array_equal(ours(q, k, v), jax.jit(xla)(q, k, v))
    assert "hydra_jax_attention" not in ours.lower(q, k, v).as_text()


def test_under_vmap_each_member_gets_its_own_gradients(built):
    q, k, v, g = draws((3, 2, 2, 6, 4), (3, 2, 2, 6, 4))
    batched = jax.jit(jax.vmap(kernel_pass))(q, k, v, g)
    for m in range(3):
        one = reference(q[m], k[m], v[m], g[m])
        for a, b in zip(batched, one, strict=True):
            np.testing.assert_allclose(a[m], b, rtol=0, atol=1e-6 * np.abs(b).max())


def test_non_finite_inputs_stay_non_finite(built):
    q, k, v, g = draws((1, 1, 4, 4), (1, 1, 4, 4))
    q[0, 0, 2, 1] = np.nan
    out, dq, dk, dv = jax.jit(kernel_pass)(q, k, v, g)
    assert np.isnan(out[0, 0, 2]).all() and np.isfinite(np.delete(out[0, 0], 2, 0)).all()
    assert np.isnan(dk).any() and np.isnan(dv).any() and np.isnan(dq[0, 0, 2]).all()


def test_the_kernel_refuses_shapes_it_does_not_compute(built):
    def forward(q, k, v):
        shapes = (
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct(q.shape[:-1], q.dtype),
        )
        return jax.ffi.ffi_call(na.FORWARD, shapes)(q, k, v)

    wide = jnp.zeros((1, 2, 3, 257), jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError, match="heads wider than 256"):
        forward(wide, wide, wide)
    q, kv = jnp.zeros((1, 2, 3, 4), jnp.float32), jnp.zeros((2, 2, 3, 4), jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"q \[\.\.\., T, K\] and k, v"):
        forward(q, kv, kv)
    # Results and residuals of other shapes would be written or read out of bounds.
    short = jax.ShapeDtypeStruct((1, 2, 2, 4), jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"attention forward: o .* unlike q"):
        jax.ffi.ffi_call(na.FORWARD, (short, jax.ShapeDtypeStruct((1, 2, 3), jnp.float32)))(q, q, q)
    like_q = jax.ShapeDtypeStruct(q.shape, q.dtype)
    lse = jnp.zeros((1, 2, 2), jnp.float32)  # one query short
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"attention backward: .* unlike q"):
        jax.ffi.ffi_call(na.BACKWARD, (like_q,) * 3)(q, q, q, q, lse, q)


def test_applies_only_where_the_kernel_is_faster_and_one_device_runs_it(built, monkeypatch):
    x = jnp.zeros((2, 3, 5, 8), jnp.float32)
    assert na.applies(x, x, x)
    wide = jnp.zeros((2, 3, 5, na.MAX_HEAD_DIM + 1), jnp.float32)
    assert not na.applies(wide, wide, wide)
    half = x.astype(jnp.bfloat16)
    assert not na.applies(half, half, half)
    for empty in (jnp.zeros((2, 3, 0, 8), jnp.float32), jnp.zeros((2, 3, 5, 0), jnp.float32)):
        assert not na.applies(empty, empty, empty)
    with jax.set_mesh(make_mesh(data=2)):
        assert not na.applies(x, x, x)
    monkeypatch.setenv(native.SWITCH, "0")
    assert not na.applies(x, x, x)


def layer_gradient(bias: bool, deterministic: bool, dropout: float = 0.0, dtype=None):
    """A 4-head attention layer of width 6's value and gradient, and whether its program calls
    the native kernels (`dtype`: of its products and their outputs, q, k and v)."""
    layer = Attention(4, 6, 24, dropout=dropout, dtype=dtype, out_dtype=dtype)
    x = jax.random.normal(jax.random.key(0), (2, 7, 24))
    mask = jnp.ones((2, 7), jnp.int32).at[1, 5:].set(0)
    terms = jnp.where(mask[:, None, None, :] > 0, 0.0, -1e9) if bias else None
    params = layer.init(jax.random.key(1), x, terms, None)["params"]

    def loss(params):
        out, _ = layer.apply(
            {"params": params}, x, terms, None, deterministic, rngs={"dropout": jax.random.key(2)}
        )
        return jnp.sum(out**2)

    step = jax.jit(jax.value_and_grad(loss))
    return step(params), "hydra_jax_attention_backward" in step.lower(params).as_text()


def test_the_attention_layer_uses_the_kernels_without_logit_terms_or_dropout(built, monkeypatch):
    (value, grads), native_used = layer_gradient(bias=False, deterministic=True)
    assert native_used
    assert not layer_gradient(bias=True, deterministic=True)[1]  # a padding bias: XLA's
    assert not layer_gradient(bias=False, deterministic=False, dropout=0.1)[1]
    assert layer_gradient(bias=False, deterministic=False, dropout=0.0)[1]
    monkeypatch.setenv(native.SWITCH, "0")
    (want_value, want), native_used = layer_gradient(bias=False, deterministic=True)
    assert not native_used
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    # One scale for all: the key bias's exact gradient is 0 (softmax ignores a shift), so each
    # program's is rounding noise.
    scale = max(np.abs(b).max() for b in jax.tree.leaves(want))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


def test_bf16_queries_keys_and_values_reach_the_kernels_in_f32(built, monkeypatch):
    (value, grads), native_used = layer_gradient(False, True, dtype=jnp.bfloat16)
    assert native_used
    monkeypatch.setenv(native.SWITCH, "0")
    (want_value, want), _ = layer_gradient(False, True, dtype=jnp.bfloat16)
    # XLA rounds the probabilities to bf16 for the value product; the kernels keep them in f32.
    np.testing.assert_allclose(value, want_value, rtol=1e-2)
    scale = max(np.abs(b).max() for b in jax.tree.leaves(want))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-2 * scale)


@pytest.fixture
def fresh_load(monkeypatch, tmp_path):
    """`native.load` with an empty cache in `tmp_path`, unloaded again afterwards."""
    monkeypatch.setenv("HYDRA_JAX_CACHE", str(tmp_path))
    native.load.cache_clear()
    yield tmp_path
    native.load.cache_clear()


def test_without_a_compiler_a_warning_names_it_and_xla_runs(fresh_load, monkeypatch):
    monkeypatch.setenv("CXX", str(fresh_load / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="no native attention kernel .*no-such-compiler"):
        assert not native.load("attention")


def test_a_failed_build_shows_the_compilers_message(fresh_load, monkeypatch):
    compiler = fresh_load / "broken-c++"
    compiler.write_text('#!/bin/sh\n[ "$1" = --version ] && echo broken 1.0 && exit 0\n'
                        'echo "attention.cc:1: error: boom" >&2; exit 1\n')  # fmt: skip
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    with pytest.warns(RuntimeWarning, match="(?s)could not compile.*error: boom"):
        assert not native.load("attention")
    assert not list((fresh_load / "native").glob("*.so"))  # nothing half-built is kept


def test_a_build_is_cached_per_source_compiler_and_cpu(fresh_load, monkeypatch):
    compiler = os.environ.get("CXX", "c++")
    first = native.build("attention", compiler)
    assert first.parent == fresh_load / "native" and list(first.parent.iterdir()) == [first]
    built_at = first.stat().st_mtime_ns
    assert native.build("attention", compiler) == first and first.stat().st_mtime_ns == built_at
    library = ctypes.CDLL(str(first))
    assert all(hasattr(library, symbol) for symbol in native.TARGETS["attention"].values())
    monkeypatch.setattr(native, "cpu_identity", lambda: "another CPU kind")
    assert native.library_path("attention", compiler) != first
