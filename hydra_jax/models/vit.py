"""ViT (pre-LN): conv patch embedding, CLS token, final LayerNorm, classifier on CLS (or, as a
dual encoder's vision tower, a projection and a zero-shot classifier)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.config import ViTConfig
from hydra_jax.models.encoder import (
    ACTIVATIONS,
    Encoder,
    HeadMask,
    LayerNorm,
    StagedEncoder,
    compute_dtype,
    stack_attentions,
    wide,
)
from hydra_jax.models.outputs import ModelOutput, Stem

LOGIT_SCALE_INIT = 2.6592  # log(1 / 0.07), CLIP's initial temperature


def normalise(x: jax.Array) -> jax.Array:
    """`x / |x|` over the last axis (embeddings onto the unit sphere)."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def zero_shot_logits(
    embeds: jax.Array, class_embeds: jax.Array, logit_scale: jax.Array
) -> jax.Array:
    """`exp(logit_scale) * cos(embeds [B, E], class_embeds [C, E])` -> `[B, C]`."""
    return jnp.exp(logit_scale) * (normalise(embeds) @ normalise(class_embeds).T)


def patch_conv(width: int, patch_size: int, use_bias: bool, dtype: jnp.dtype | None) -> nn.Conv:
    P = patch_size
    return nn.Conv(width, (P, P), strides=(P, P), padding="VALID", use_bias=use_bias, dtype=dtype)


def patchify(conv: nn.Conv, pixel_values: jax.Array) -> jax.Array:
    """`[B, C, H, W]` (HF layout) -> `[B, T, D]` patch embeddings, T = (H / P) * (W / P)."""
    x = conv(jnp.transpose(pixel_values, (0, 2, 3, 1)))  # [B, H, W, C] -> [B, H/P, W/P, D]
    return x.reshape(x.shape[0], -1, x.shape[-1])  # [B, T, D]


def prepend(token: jax.Array, x: jax.Array) -> jax.Array:
    """`[D]` token before the `[B, T, D]` sequence -> `[B, T + 1, D]`."""
    B, _, D = x.shape
    return jnp.concatenate([jnp.broadcast_to(token, (B, 1, D)).astype(x.dtype), x], axis=1)


class ViT(StagedEncoder):
    """`embed` (patches, CLS, positions) -> `encode` -> `head` (final LN, pooler, classifier)."""

    config: ViTConfig

    def setup(self) -> None:
        c, e, dtype = self.config, self.config.encoder, compute_dtype(self.config.encoder)
        T = (c.image_size // c.patch_size) ** 2
        self.patch = patch_conv(e.width, c.patch_size, use_bias=True, dtype=dtype)
        self.cls_token = self.param("cls_token", nn.initializers.normal(0.02), (e.width,))
        self.position_embeddings = self.param(
            "position_embeddings", nn.initializers.normal(0.02), (T + 1, e.width)
        )
        self.encoder = Encoder(e)
        self.final_norm = LayerNorm(e.layer_norm_eps)
        if c.pooler:
            self.pooler = nn.Dense(e.width, dtype=dtype)
        if c.projection_dim:  # a dual encoder's vision tower
            self.projection = nn.Dense(c.projection_dim, use_bias=False)
        if c.num_labels and c.projection_dim:  # zero-shot: fixed class embeddings
            init = nn.initializers.normal(0.02)
            self.class_embeds = self.param("class_embeds", init, (c.num_labels, c.projection_dim))
            scale = nn.initializers.constant(LOGIT_SCALE_INIT)
            self.logit_scale = self.param("logit_scale", scale, ())
        elif c.num_labels:
            self.classifier = nn.Dense(c.num_labels)
        self.Dropout_0 = nn.Dropout(e.dropout)  # the compact module's name: same RNG stream

    def embed(self, pixel_values: jax.Array, deterministic: bool = True) -> Stem:
        """`pixel_values`: `[B, C, H, W]` floats, as HF image processors produce them."""
        x = prepend(self.cls_token, patchify(self.patch, pixel_values))  # [B, T+1, D]
        x = x + self.position_embeddings[None].astype(x.dtype)
        return Stem(self.Dropout_0(x, deterministic=deterministic))

    def head(self, x: jax.Array, deterministic: bool = True) -> ModelOutput:
        del deterministic  # no dropout after the encoder
        c = self.config
        x = self.final_norm(x)
        pooled = logits = embeds = None
        if c.pooler:
            pooled = ACTIVATIONS[c.pooler_activation](self.pooler(x[:, 0]))
        if c.projection_dim:
            embeds = self.projection(wide(pooled))  # [B, E]
        if c.num_labels and c.projection_dim:  # [B, C]
            logits = zero_shot_logits(embeds, self.class_embeds, self.logit_scale)
        elif c.num_labels:
            logits = self.classifier(wide(x[:, 0]))  # [B, C]
        return ModelOutput(last_hidden_state=x, pooler_output=pooled, logits=logits, embeds=embeds)

    def __call__(
        self,
        pixel_values: jax.Array,
        *,
        head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> ModelOutput:
        stem = self.embed(pixel_values, deterministic)
        x, attentions = self.encode(stem, head_mask, deterministic)
        out = self.head(x, deterministic)
        return out.replace(attentions=stack_attentions(attentions) if output_attentions else None)
