"""Multi-head attention with a real head axis and the head mask: the one pruning point."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def padding_bias(attention_mask: jax.Array, dtype: jnp.dtype, causal: bool = False) -> jax.Array:
    """Additive attention bias from a key padding mask.

    Masked logits get the dtype's most negative finite value, as `transformers` does, so a row
    with no valid key degrades to a uniform average instead of NaN.

    Args:
      attention_mask: `[B, S]`, 1 for real tokens and 0 for padding.
      dtype: dtype of the attention logits.
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
    """

    num_heads: int
    head_dim: int
    width: int
    qkv_bias: bool = True
    dropout: float = 0.0

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
          bias: `[B, 1, T, S]` additive attention bias, or None (every key visible: images).
          head_mask: `[N]` floats or None (all heads kept).
          deterministic: disables attention dropout.

        Returns:
          `([B, T, D] output, [B, N, T, S] attention probabilities)`.
        """
        N, K = self.num_heads, self.head_dim

        def projection(name: str) -> nn.DenseGeneral:
            return nn.DenseGeneral(
                (N, K), use_bias=self.qkv_bias, kernel_init=_kernel_init, name=name
            )

        q = projection("query")(x)  # [B, T, N, K]
        k = projection("key")(x)  # [B, S, N, K]
        v = projection("value")(x)  # [B, S, N, K]
        logits = jnp.einsum("BTNK,BSNK->BNTS", q, k) / jnp.sqrt(K).astype(x.dtype)
        probs = jax.nn.softmax(logits if bias is None else logits + bias, axis=-1)  # [B, N, T, S]
        dropped = nn.Dropout(self.dropout)(probs, deterministic=deterministic)
        context = jnp.einsum("BNTS,BSNK->BTNK", dropped, v)
        if head_mask is not None:
            context = context * head_mask.astype(x.dtype)[None, None, :, None]
        out = nn.DenseGeneral(self.width, axis=(-2, -1), kernel_init=_kernel_init, name="out")(
            context
        )  # [B, T, D]
        return out, probs
