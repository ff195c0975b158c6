"""ViT (pre-LN): conv patch embedding, CLS token, final LayerNorm, classifier on CLS."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.config import ViTConfig
from hydra_jax.models.encoder import ACTIVATIONS, Encoder, HeadMask, LayerNorm, stack_attentions
from hydra_jax.models.outputs import ModelOutput


def patchify(pixel_values: jax.Array, width: int, patch_size: int, use_bias: bool) -> jax.Array:
    """`[B, C, H, W]` (HF layout) -> `[B, T, D]` patch embeddings, T = (H / P) * (W / P)."""
    x = jnp.transpose(pixel_values, (0, 2, 3, 1))  # [B, H, W, C]
    P = patch_size
    x = nn.Conv(width, (P, P), strides=(P, P), padding="VALID", use_bias=use_bias, name="patch")(x)
    return x.reshape(x.shape[0], -1, width)  # [B, H/P, W/P, D] -> [B, T, D]


class ViT(nn.Module):
    config: ViTConfig

    @nn.compact
    def __call__(
        self,
        pixel_values: jax.Array,
        *,
        head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> ModelOutput:
        """`pixel_values`: `[B, C, H, W]` floats, as HF image processors produce them."""
        c, e = self.config, self.config.encoder
        x = patchify(pixel_values, e.width, c.patch_size, use_bias=True)
        B, T = x.shape[:2]
        cls = self.param("cls_token", nn.initializers.normal(0.02), (e.width,))
        x = jnp.concatenate([jnp.broadcast_to(cls, (B, 1, e.width)).astype(x.dtype), x], axis=1)
        pos = self.param("position_embeddings", nn.initializers.normal(0.02), (T + 1, e.width))
        x = nn.Dropout(e.dropout)(x + pos[None], deterministic=deterministic)  # [B, T+1, D]
        bias = jnp.zeros((B, 1, T + 1, T + 1), x.dtype)
        x, attentions = Encoder(e, name="encoder")(x, bias, head_mask, deterministic)
        x = LayerNorm(e.layer_norm_eps, name="final_norm")(x)

        pooled = logits = None
        if c.pooler:
            pooled = ACTIVATIONS[c.pooler_activation](nn.Dense(e.width, name="pooler")(x[:, 0]))
        if c.num_labels:
            logits = nn.Dense(c.num_labels, name="classifier")(x[:, 0])  # [B, C]
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            logits=logits,
            attentions=stack_attentions(attentions) if output_attentions else None,
        )
