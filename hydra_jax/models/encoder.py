"""The layer stack shared by BERT and DeBERTa (post-LN), ViT and CLIP (pre-LN)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import Attention, window_bias
from hydra_jax.models.config import EncoderConfig
from hydra_jax.models.dense import Dense, as_rows, wide_dtype
from hydra_jax.models.dropout import Dropout
from hydra_jax.models.outputs import ModelOutput, Stem
from hydra_jax.models.sharding import constrain


def _quick_gelu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(1.702 * x)


def _gelu(x: jax.Array) -> jax.Array:
    """The exact GELU `x * Phi(x)` as PyTorch writes it, `x / 2 * (1 + erf(x / sqrt(2)))`.
    `jax.nn.gelu` takes `erfc`, which XLA:CPU evaluates 2.2x slower (`[2056, 1536]` floats: 2.45
    vs 1.12 ms); both are 1.4e-6 from PyTorch's there. The difference is in the far negative
    tail, where the output is below 1e-6 in absolute value."""
    return 0.5 * x * (1 + jax.lax.erf(x * math.sqrt(0.5)))


# HF `hidden_act` names -> functions. "gelu" is the exact erf GELU, as in `transformers`.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": _gelu,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": _quick_gelu,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}

HeadMask = jax.Array | Sequence[jax.Array]


def compute_dtype(config: EncoderConfig) -> jnp.dtype | None:
    """The dtype of the encoder layers' dense products' operands, for `dtype=`: None for
    "float32" (the parameters' own dtype: float32, or float64 where a check promotes the
    weights)."""
    return None if config.dtype == "float32" else jnp.dtype(config.dtype)


def hidden_dtype(config: EncoderConfig) -> jnp.dtype | None:
    """The dtype of hidden states and of everything outside the dense products, for Flax's
    `dtype=` (embeddings, heads) and `out_dtype=`: None for a float32 model (the parameters'
    own dtype, as `compute_dtype`), else `config.hidden_dtype`."""
    return None if config.dtype == "float32" else jnp.dtype(config.hidden_dtype)


def wide(x: jax.Array) -> jax.Array:
    """`x` in float32 (float64 stays): what logits, embeddings and poolers' readers get."""
    return x.astype(wide_dtype(x.dtype))


class LayerNorm(nn.Module):
    """LayerNorm over the last axis as torch computes it: two-pass variance (Flax's default
    E[x^2] - E[x]^2 cancels catastrophically when a row's mean is large against its spread).

    Statistics in float32 (float64 for float64 inputs, which checks use), never lower; the
    output in the input's dtype. Casts are explicit, so it runs under strict dtype promotion.
    Parameters `scale` and `bias` `[D]`, as `flax.linen.LayerNorm` names them; in float32 the
    arithmetic is Flax's, operation for operation.
    """

    epsilon: float
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        D = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (D,), jnp.float32)
        dtype = wide_dtype(x.dtype)
        shape = (1,) * (x.ndim - 1) + (D,)  # explicit ranks: [..., 1] statistics, [1.., D] params
        h = x.astype(dtype)
        mean = h.mean(-1, keepdims=True)
        var = jnp.square(h - mean).mean(-1, keepdims=True)
        mul = jax.lax.rsqrt(var + self.epsilon) * scale.astype(dtype).reshape(shape)
        if not self.use_bias:
            return ((h - mean) * mul).astype(x.dtype)
        bias = self.param("bias", nn.initializers.zeros, (D,), jnp.float32)
        return ((h - mean) * mul + bias.astype(dtype).reshape(shape)).astype(x.dtype)


class Mlp(nn.Module):
    """Two dense layers; `gated`: `fc1` gives an input and a gate `[B, T, F]` each (GLU). The
    products' operands are in `dtype`, their outputs and the activation in `out_dtype`."""

    mlp_dim: int
    width: int
    activation: str
    dtype: jnp.dtype | None = None
    use_bias: bool = True
    gated: bool = False
    out_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` `[..., D]` -> `[..., D]`, the rows run as one `[R, D]` matrix (`as_rows`)."""
        F = self.mlp_dim * (2 if self.gated else 1)
        dense = functools.partial(
            Dense, use_bias=self.use_bias, dtype=self.dtype, out_dtype=self.out_dtype
        )
        h = dense(F, name="fc1")(as_rows(x))
        if self.gated:
            h, gate = jnp.split(h, 2, axis=-1)  # [R, F] each
            h = ACTIVATIONS[self.activation](h) * gate
        else:
            h = ACTIVATIONS[self.activation](h)  # [R, F]
        out = dense(self.width, name="fc2")(h)
        return out.reshape(*x.shape[:-1], self.width)


def mlp_block(c: EncoderConfig, name: str | None = None) -> Mlp:
    return Mlp(
        c.mlp_dim, c.width, c.activation, compute_dtype(c), c.mlp_bias, c.gated_mlp,
        hidden_dtype(c), name=name,
    )  # fmt: skip


def layer_norm(c: EncoderConfig, name: str | None = None) -> LayerNorm:
    return LayerNorm(c.layer_norm_eps, c.norm_bias, name=name)


Scale = Callable[[jax.Array], jax.Array]


def channels(gamma: jax.Array, h: jax.Array) -> jax.Array:
    """A per-channel `[D]` vector shaped to multiply `h` `[..., D]` (explicit ranks), in `h`'s
    dtype."""
    return gamma.astype(h.dtype).reshape((1,) * (h.ndim - 1) + gamma.shape)


def layer_scales(module: nn.Module, c: EncoderConfig) -> dict[str, Scale]:
    """Per block (`attention`, `mlp`): its output times a learned `[D]` scale where the stack has
    layer scale (parameters `attention_scale`, `mlp_scale`; created in `module`), else as is."""
    if not c.layer_scale:
        return {"attention": lambda h: h, "mlp": lambda h: h}
    out = {}
    for block in ("attention", "mlp"):
        gamma = module.param(f"{block}_scale", nn.initializers.ones, (c.width,), jnp.float32)
        out[block] = lambda h, gamma=gamma: h * channels(gamma, h)
    return out


def attention_block(
    c: EncoderConfig, layer: int, num_heads: int, name: str | None = None
) -> Attention:
    """Layer `layer`'s attention module as the stack's config describes it (encoder, fusion)."""
    return Attention(
        num_heads,
        c.head_dim,
        c.width,
        c.qkv_bias,
        c.attention_dropout,
        compute_dtype(c),
        c.relative,
        c.dropout,
        c.out_bias,
        c.rotary[layer] if c.rotary else 0.0,
        hidden_dtype(c),
        name=name,
    )


def layer_bias(c: EncoderConfig, layer: int, bias: jax.Array | None, T: int) -> jax.Array | None:
    """The attention bias of layer `layer`: the stack's, and a local layer's window."""
    if not (c.windows and c.windows[layer]):
        return bias
    return window_bias(bias, T, c.windows[layer], compute_dtype(c) or jnp.float32)


def has_attention_norm(c: EncoderConfig, layer: int) -> bool:
    return c.first_norm or layer > 0


def distance_embeddings(params: dict, c: EncoderConfig) -> jax.Array:
    """The stack's `[2A, D]` distance embeddings (DeBERTa), normalised where it says so, from
    its weights `params` (`rel_embeddings`, `rel_norm`)."""
    table = params["rel_embeddings"]
    if c.relative is not None and c.relative.norm:
        table = LayerNorm(c.layer_norm_eps).apply({"params": params["rel_norm"]}, table)
    return table


class EncoderLayer(nn.Module):
    config: EncoderConfig
    num_heads: int
    index: int = 0  # the layer's place in the stack (its rotary base, window, first norm)

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        bias: jax.Array | None,
        head_mask: jax.Array | None,
        deterministic: bool,
        distances: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        c, l = self.config, self.index
        attention = attention_block(c, l, self.num_heads, name="attention")
        mlp = mlp_block(c, name="mlp")
        if has_attention_norm(c, l):
            attention_norm = layer_norm(c, name="attention_norm")
        else:
            attention_norm = lambda h: h  # noqa: E731 (ModernBERT's layer 0)
        mlp_norm = layer_norm(c, name="mlp_norm")
        drop = Dropout(c.dropout, deterministic=deterministic)
        scale = layer_scales(self, c)
        bias = layer_bias(c, l, bias, x.shape[1])
        x = constrain(x, ("batch", None, None))  # [B, T, D]
        if c.pre_norm:
            a, probs = attention(attention_norm(x), bias, head_mask, deterministic, distances)
            x = x + drop(scale["attention"](a))
            x = x + drop(scale["mlp"](mlp(mlp_norm(x))))
        else:
            a, probs = attention(x, bias, head_mask, deterministic, distances)
            x = attention_norm(x + drop(a))
            x = mlp_norm(x + drop(mlp(x)))
        return constrain(x, ("batch", None, None)), probs


class Encoder(nn.Module):
    """L layers; each layer's own head count comes from `config.num_heads`."""

    config: EncoderConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        bias: jax.Array | None,
        head_mask: HeadMask | None,
        deterministic: bool,
        layers: tuple[int, int] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        """Runs the stack, or the slice `layers = (start, stop)` of it.

        Args:
          x: `[B, T, D]`, the input of layer `start`.
          bias: `[B, 1, T, S]` additive attention bias, or None (no padding: images).
          head_mask: `[L, N]`, or L arrays `[N_l]` when layers have different head counts, or None.
          deterministic: disables dropout.
          layers: run layers `start..stop-1` only (default: all). A search that changes only
            layer l reuses the hidden state entering l instead of recomputing layers < l.

        Returns:
          `([B, T, D], attention probabilities [B, N_l, T, S] of each layer run)`.
        """
        c = self.config
        start, stop = layers or (0, c.num_layers)
        distances = None
        if c.relative is not None:  # DeBERTa: one distance table for every layer
            table = self.param(
                "rel_embeddings",
                nn.initializers.normal(0.02),
                (2 * c.relative.span, c.width),
                jnp.float32,
            )
            norm = LayerNorm(c.layer_norm_eps, name="rel_norm") if c.relative.norm else None
            distances = table if norm is None else norm(table)  # as `distance_embeddings`
        attentions = []
        # `deterministic` (argument 4, counting the module) is a Python bool, static to remat.
        kind = nn.remat(EncoderLayer, static_argnums=(4,)) if c.remat else EncoderLayer
        for l in range(start, stop):
            mask = None if head_mask is None else head_mask[l]
            layer = kind(c, c.num_heads[l], l, name=f"layer_{l}")
            x, probs = layer(x, bias, mask, deterministic, distances)
            attentions.append(probs)
        return x, tuple(attentions)


class StagedEncoder(nn.Module):
    """Base of every family module: its `setup` defines `self.encoder`, and the `encode` stage
    (a layer range from a `Stem`) is the same for all of them."""

    def encode(
        self,
        stem: Stem,
        head_mask: HeadMask | None = None,
        deterministic: bool = True,
        layers: tuple[int, int] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        """`([B, T, D] after layer stop - 1, attention probabilities of each layer run)`."""
        return self.encoder(stem.hidden, stem.bias, head_mask, deterministic, layers)

    def run(
        self,
        stem: Stem,
        head_mask: HeadMask | None,
        output_attentions: bool,
        deterministic: bool,
        *head_args: Any,
    ) -> ModelOutput:
        """The whole model from its stem: `head(encode(stem), *head_args)`, with the attention
        probabilities `[L, B, N, T, S]` when asked for (every family's `__call__`)."""
        x, attentions = self.encode(stem, head_mask, deterministic)
        out = self.head(x, *head_args)
        return out.replace(attentions=stack_attentions(attentions) if output_attentions else None)


def stack_attentions(attentions: tuple[jax.Array, ...]) -> jax.Array | tuple[jax.Array, ...]:
    """`[L, B, N, T, S]` when every layer has N heads; the per-layer tuple otherwise."""
    if len({a.shape for a in attentions}) == 1:
        return jnp.stack(attentions)
    return attentions
