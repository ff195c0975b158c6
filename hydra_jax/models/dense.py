"""Dense layers and their products under a compute dtype: float32 (float64 for checks) as they
are; narrower dtypes (bfloat16) accumulate in float32 and round once."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def wide_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32 (float64 stays float64, for checks): the dtype of softmax, LayerNorm statistics,
    logits and embeddings, whatever the compute dtype."""
    return jnp.dtype(jnp.float64 if dtype == jnp.float64 else jnp.float32)


def wide_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: tuple,
    precision: jax.lax.PrecisionLike = None,
    preferred_element_type: jnp.dtype | None = None,
) -> jax.Array:
    """`jax.lax.dot_general` for Flax's `dot_general=`: float32 and float64 operands multiply as
    they are; narrower ones (bfloat16) accumulate in float32 and are rounded to their dtype once,
    at the end.

    Asked for a bfloat16 result, XLA:CPU converts both operands to float32 and multiplies in
    float32; asked for float32, it runs its bfloat16 kernels, which use the CPU's bfloat16
    instructions where it has them. Products of bfloat16 numbers are exact in float32 and
    accumulate there either way, so the two differ only in the order of the sums. Without batch
    axes (a dense layer's product) the backward pass is `narrow_dot`'s."""
    del preferred_element_type  # the accumulation dtype is the wide one
    wide = wide_dtype(lhs.dtype)
    if lhs.dtype == wide:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision)
    (_, _), batch = dimension_numbers
    if rhs.dtype == lhs.dtype and not any(batch):
        return narrow_dot(lhs, rhs, dimension_numbers, precision).astype(lhs.dtype)
    out = jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type=wide)
    return out.astype(lhs.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def narrow_dot(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: tuple, precision: jax.lax.PrecisionLike
) -> jax.Array:
    """The float32 product of two operands of one narrow dtype, without batch axes, whose input
    gradient multiplies narrow operands too.

    JAX's own backward pass of a product with a float32 result widens the cotangent, and both
    gradients multiply in float32. Here the input's gradient multiplies the cotangent, narrowed,
    with the narrow `rhs` into float32, rounded once to the input's dtype, on the CPU's
    bfloat16 kernels. Where the caller rounds the result (or it plus a float32 bias) to the
    narrow dtype before any other use, the cotangent is a narrow number and narrowing it is
    exact: the same numbers as JAX's own up to the order of the float32 sums (products of
    narrow numbers are exact in float32). Where the caller keeps the float32 result, the
    cotangent is rounded, as in any product of narrow operands in mixed precision. The
    kernel's gradient, a product over the rows of both operands, stays in float32: XLA:CPU
    (jaxlib 0.10) has no bfloat16 kernel for every layout it may choose for that product and
    refuses the program at run time. Forward-mode autodiff (`jax.jvp`) does not apply."""
    wide = wide_dtype(lhs.dtype)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type=wide)


def _narrow_dot_forward(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: tuple, precision: jax.lax.PrecisionLike
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return narrow_dot(lhs, rhs, dimension_numbers, precision), (lhs, rhs)


def _narrow_dot_backward(
    dimension_numbers: tuple,
    precision: jax.lax.PrecisionLike,
    operands: tuple[jax.Array, jax.Array],
    cotangent: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    lhs, rhs = operands
    wide = wide_dtype(lhs.dtype)
    (lhs_in, rhs_in), _ = dimension_numbers  # paired contracted axes
    lhs_out = [a for a in range(lhs.ndim) if a not in lhs_in]  # the output's leading axes
    rhs_out = [a for a in range(rhs.ndim) if a not in rhs_in]  # its trailing axes
    n = len(lhs_out)
    narrow = cotangent.astype(lhs.dtype)  # exact where the caller rounded the result
    # [lhs_out..., sorted(rhs_in)...]: each lhs axis is where its own or its partner's axis is
    d_lhs = jax.lax.dot_general(
        narrow, rhs, ((tuple(range(n, narrow.ndim)), tuple(rhs_out)), ((), ())),
        precision, preferred_element_type=wide,
    )  # fmt: skip
    partner = dict(zip(lhs_in, rhs_in, strict=True))
    at = [lhs_out.index(a) if a in lhs_out else n + sorted(rhs_in).index(partner[a])
          for a in range(lhs.ndim)]  # fmt: skip
    d_lhs = d_lhs.transpose(at).astype(lhs.dtype)
    # [sorted(lhs_in)..., rhs_out...], in float32
    d_rhs = jax.lax.dot_general(
        lhs.astype(wide), cotangent.astype(wide), ((tuple(lhs_out), tuple(range(n))), ((), ())),
        precision,
    )  # fmt: skip
    partner = dict(zip(rhs_in, lhs_in, strict=True))
    at = [len(lhs_in) + rhs_out.index(a) if a in rhs_out else sorted(lhs_in).index(partner[a])
          for a in range(rhs.ndim)]  # fmt: skip
    return d_lhs, d_rhs.transpose(at).astype(rhs.dtype)


narrow_dot.defvjp(_narrow_dot_forward, _narrow_dot_backward)


def as_rows(x: jax.Array, features: int = 1) -> jax.Array:
    """`x` `[..., F...]` as a matrix of rows `[R, F...]` (`features` trailing axes kept).

    Dense layers take their inputs as rows: autodiff then writes a kernel's gradient as one
    product contracting the row axis, `[R, in]^T x [R, out]`. Over `[B, T, in]` it contracts
    two axes, and XLA:CPU first copies the cotangent into a transposed layout (with the
    element-wise work that produced it fused into that strided copy). The forward product is
    the same either way."""
    lead, kept = x.shape[: x.ndim - features], x.shape[x.ndim - features :]
    return x.reshape(math.prod(lead), *kept)  # explicit: a pruned layer's kept axes may be 0


def lecun_normal(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    """Flax's default kernel initialiser, and zeros for a zero-size kernel (a layer pruned to no
    heads), where fan-in scaling would divide by 0."""
    if 0 in shape:
        return jnp.zeros(shape, dtype)
    return nn.initializers.lecun_normal()(key, shape, dtype)


def _as_tuple(x: int | Sequence[int]) -> tuple[int, ...]:
    return (x,) if isinstance(x, int) else tuple(x)


class Dense(nn.Module):
    """A dense layer over the trailing input axes `axis` to `features`: Flax's `nn.Dense` /
    `nn.DenseGeneral` (parameter names, shapes and initialisation, and in float32 or float64 its
    arithmetic), whose narrow (bfloat16) product takes its bias in float32 and is rounded once,
    to `out_dtype`.

    Flax rounds the product to the compute dtype and adds the bias rounded to it; the bias's
    gradient then sums bfloat16 cotangents over the rows, which XLA:CPU rewrites into trees of
    `reduce-window`s. Here the bias is added to the float32 product before the one rounding, so
    its gradient sums float32 cotangents, and the product's backward pass is `narrow_dot`'s.
    With a float32 `out_dtype` nothing is rounded after the product: only its operands are
    narrow.

    Attributes:
      features: the output axes' sizes.
      axis: the contracted input axes, trailing (`-1`, or `(-2, -1)`).
      use_bias: whether the layer carries a bias.
      dtype: compute dtype, the product operands' (None: the inputs' and parameters' common
        dtype).
      out_dtype: the output's dtype (None: `dtype`, as in Flax).
      kernel_init: initialiser of the kernel as a matrix `[prod(inputs), prod(features)]`,
        then shaped `[*inputs, *features]` (as Flax's `nn.DenseGeneral` does).
    """

    features: int | Sequence[int]
    axis: int | Sequence[int] = -1
    use_bias: bool = True
    dtype: jnp.dtype | None = None
    kernel_init: Callable = lecun_normal
    out_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` `[..., *inputs]` -> `[..., *features]`."""
        features, n = _as_tuple(self.features), len(_as_tuple(self.axis))
        if sorted(a % x.ndim for a in _as_tuple(self.axis)) != list(range(x.ndim - n, x.ndim)):
            raise ValueError(f"Dense contracts trailing axes, not {self.axis} of {x.shape}")
        inputs = x.shape[x.ndim - n :]

        def kernel_init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
            flat = (math.prod(inputs), math.prod(features))
            return self.kernel_init(key, flat, dtype).reshape(shape)

        kernel = self.param("kernel", kernel_init, (*inputs, *features), jnp.float32)
        bias = (
            self.param("bias", nn.initializers.zeros, features, jnp.float32)
            if self.use_bias
            else None
        )
        dtype = jnp.dtype(jnp.result_type(x, kernel) if self.dtype is None else self.dtype)
        x, kernel = x.astype(dtype), kernel.astype(dtype)
        dims = ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ()))
        if dtype == wide_dtype(dtype):
            y = jax.lax.dot_general(x, kernel, dims)
        else:
            y = narrow_dot(x, kernel, dims, None)  # float32, rounded once below
        if bias is not None:  # broadcast over the rows, explicitly
            y = y + bias.astype(y.dtype).reshape(*(1,) * (x.ndim - n), *features)
        return y.astype(dtype if self.out_dtype is None else self.out_dtype)
