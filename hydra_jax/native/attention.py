"""The attention core's training pass on the CPU by the native kernels of `attention.cc`.

`attend(reference, q, k, v)` is `reference(q, k, v)` (the model's own XLA formulation) wherever
it is not differentiated, so predictions never change; under `jax.grad` its forward and backward
passes are the kernels'. XLA:CPU runs the batched products of narrow heads (the study ViT's 12
heads of width 6 on 50 tokens) far below the speed of its wider products; the kernels compute
each (batch row, head) slice whole, in cache, vectorised along the queries; up to heads of width
`MAX_HEAD_DIM` they are faster, beyond it XLA's products are (`python -m bench.native`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from hydra_jax.native import enabled, load

FORWARD, BACKWARD = "hydra_jax_attention_forward", "hydra_jax_attention_backward"
MAX_HEAD_DIM = 8

Reference = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def applies(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether `attend` computes the training pass of queries `q` `[..., T, K]` against keys and
    values `[..., S, K]` natively: float32, K <= `MAX_HEAD_DIM`, on the CPU backend outside a
    mesh of several devices (the partitioner would run a custom call whole on every device), and
    the kernels built."""
    shapes = (
        q.ndim >= 2
        and q.ndim == k.ndim == v.ndim
        and min(q.shape[-2], k.shape[-2], q.shape[-1]) > 0
    )
    return (
        shapes
        and all(x.dtype == jnp.float32 for x in (q, k, v))
        and q.shape[-1] <= MAX_HEAD_DIM
        and jax.default_backend() == "cpu"
        and jax.sharding.get_abstract_mesh().size <= 1
        and enabled()
        and load("attention")
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def attend(reference: Reference, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """softmax(q k^T) v for scaled queries `q` `[..., T, K]`, keys and values `[..., S, K]`
    (`applies` must hold): `reference(q, k, v)`, differentiated by the kernels."""
    return reference(q, k, v)


def _forward(
    reference: Reference, q: jax.Array, k: jax.Array, v: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    del reference  # the kernel computes the same softmax, and the log-sum-exp the backward needs
    out, lse = jax.ffi.ffi_call(
        FORWARD,
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:-1], q.dtype)),
        vmap_method="broadcast_all",
    )(q, k, v)
    return out, (q, k, v, out, lse)


def _backward(
    reference: Reference, residuals: tuple[jax.Array, ...], g: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    del reference
    q, k, v = residuals[:3]
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    dq, dk, dv = jax.ffi.ffi_call(BACKWARD, shapes, vmap_method="broadcast_all")(*residuals, g)
    return dq, dk, dv


attend.defvjp(_forward, _backward)
