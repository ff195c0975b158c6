"""Multi-head attention with a real head axis and the head mask: the one pruning point."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def wide_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32 (float64 stays float64, for checks): the dtype of softmax, LayerNorm statistics,
    logits and embeddings, whatever the compute dtype."""
    return jnp.dtype(jnp.float64 if dtype == jnp.float64 else jnp.float32)


def padding_bias(attention_mask: jax.Array, dtype: jnp.dtype, causal: bool = False) -> jax.Array:
    """Additive attention bias from a key padding mask.

    Masked logits get the dtype's most negative finite value, as `transformers` does, so a row
    with no valid key degrades to a uniform average instead of NaN.

    Args:
      attention_mask: `[B, S]`, 1 for real tokens and 0 for padding.
      dtype: the compute dtype; the bias is in the softmax dtype (`wide_dtype`).
      causal: also forbid each query from attending to later keys (CLIP text).

    Returns:
      `[B, 1, T, S]` bias (T == S), 0 where attention is allowed.
    """
    allowed = attention_mask[:, None, None, :].astype(bool)  # [B, 1, 1, S]
    if causal:
        S = attention_mask.shape[-1]
        allowed = allowed & jnp.tril(jnp.ones((S, S), bool))[None, None]  # [B, 1, T, S]
    else:
        allowed = jnp.broadcast_to(
            allowed, (*allowed.shape[:2], allowed.shape[-1], allowed.shape[-1])
        )
    dtype = wide_dtype(dtype)
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.finfo(dtype).min)


def _kernel_init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    # A pruned layer may have zero heads: a zero-size kernel, where fan-in scaling divides by 0.
    if 0 in shape:
        return jnp.zeros(shape, dtype)
    return nn.initializers.lecun_normal()(key, shape, dtype)


class Attention(nn.Module):
    """Self-attention whose per-head context is scaled by `head_mask` before the output projection.

    Attributes:
      num_heads: N (may be 0 after pruning: the output is then the output bias alone).
      head_dim: K.
      width: D.
      qkv_bias: whether query/key/value carry biases.
      dropout: dropout rate on the attention probabilities.
      dtype: compute dtype of the projections (None: the parameters'). The softmax is float32
        (float64 for float64 inputs) whatever it is.
    """

    num_heads: int
    head_dim: int
    width: int
    qkv_bias: bool = True
    dropout: float = 0.0
    dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        bias: jax.Array | None,
        head_mask: jax.Array | None,
        deterministic: bool = True,
    ) -> tuple[jax.Array, jax.Array]:
        """Attends.

        Args:
          x: `[B, T, D]`.
          bias: `[B, 1, T, S]` additive attention bias in the softmax dtype, or None (every key
            visible: images).
          head_mask: `[N]` floats or None (all heads kept); applied in the compute dtype.
          deterministic: disables attention dropout.

        Returns:
          `([B, T, D] output, [B, N, T, S] attention probabilities in the softmax dtype)`.
        """
        N, K = self.num_heads, self.head_dim

        def projection(name: str) -> nn.DenseGeneral:
            init, dtype = _kernel_init, self.dtype
            return nn.DenseGeneral((N, K), use_bias=self.qkv_bias, kernel_init=init, dtype=dtype,
                                   name=name)  # fmt: skip

        # Head-major [B, N, T, K] operands make both attention products plain batched matmuls,
        # and scaling q (not the [B, N, T, S] scores) keeps XLA:CPU from materialising the scale
        # as a scores-sized operand. The softmax is normalised after the value product: the
        # division then touches [B, N, T, K] contexts, not [B, N, T, S] scores, and the
        # probabilities are only computed when a caller uses them (attention entropy). Dropout
        # commutes with the row division, so the dropout mask and its meaning are unchanged; the
        # context accumulates in the softmax dtype and returns to the compute dtype after the
        # division. `bench/attention.py`: one layer's forward takes 0.48-0.53x (ViT shapes) and
        # 0.88-0.91x (MiniLM) the time of normalising first, its gradient 0.91-0.99x.
        q, k, v = (projection(name)(x).transpose(0, 2, 1, 3) for name in ("query", "key", "value"))
        q = q / jnp.sqrt(K).astype(q.dtype)  # q: [B, N, T, K]; k, v: [B, N, S, K]
        wide_t = wide_dtype(q.dtype)  # scores accumulate and stay in float32 in bf16 compute
        logits = jnp.einsum("BNTK,BNSK->BNTS", q, k, preferred_element_type=wide_t)
        if bias is not None:
            logits = logits + bias
        peak = jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True))
        unnormalised = jnp.exp(logits - peak)  # [B, N, T, S]
        total = unnormalised.sum(axis=-1, keepdims=True)  # [B, N, T, 1]
        probs = unnormalised / total
        dropped = nn.Dropout(self.dropout)(unnormalised, deterministic=deterministic)
        context = jnp.einsum("BNTS,BNSK->BNTK", dropped.astype(v.dtype), v,
                             preferred_element_type=wide_t) / total  # fmt: skip
        context = context.astype(v.dtype).transpose(0, 2, 1, 3)  # [B, T, N, K]
        if head_mask is not None:
            context = context * head_mask.astype(v.dtype)[None, None, :, None]
        out = nn.DenseGeneral(
            self.width, axis=(-2, -1), kernel_init=_kernel_init, dtype=self.dtype, name="out"
        )(context)  # [B, T, D]
        return out, probs
