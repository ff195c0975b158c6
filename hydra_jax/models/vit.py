"""ViT (pre-LN): conv patch embedding, CLS token, final LayerNorm, classifier on CLS (or, as a
dual encoder's vision tower, a projection and a zero-shot classifier). DeiT adds a distillation
token; DINOv2 resizes its positions to the image and classifies CLS with the mean patch."""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hydra_jax.models.config import EncoderConfig
from hydra_jax.models.dense import wide_dot
from hydra_jax.models.dropout import Dropout
from hydra_jax.models.encoder import (
    ACTIVATIONS,
    Encoder,
    HeadMask,
    LayerNorm,
    StagedEncoder,
    hidden_dtype,
    wide,
)
from hydra_jax.models.outputs import ModelOutput, Stem


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """ViT, DeiT or DINOv2 (with or without registers); `num_labels == 0` means no image
    classifier (which reads the final-LN CLS token).

    With `projection_dim` E > 0 it is a dual encoder's vision tower: the pooler output is
    projected to `embeds` `[B, E]`, and a classifier (`num_labels`) is zero-shot, `logits =
    exp(logit_scale) * cos(embeds, class_embeds)` over fixed class embeddings `[C, E]`.

    Attributes:
      model_type: the HF family, `vit`, `deit`, `dinov2` or `dinov2_with_registers` (DINOv2:
        layer scale in the encoder, a classifier on CLS concatenated with the mean patch token;
        without registers, positions resized bicubically for other image sizes).
      distillation_token: DeiT's second learned token, after CLS, with its own position.
      distilled_head: `DeiTForImageClassificationWithTeacher`: the logits are the mean of a
        classifier on CLS and one on the distillation token (`distillation_classifier`).
      register_tokens: DINOv2's learned register tokens, inserted after CLS once positions are
        added (they have none); the classifier's patch mean leaves them out.
    """

    encoder: EncoderConfig
    image_size: int
    patch_size: int
    num_channels: int = 3
    pooler: bool = True
    pooler_activation: str = "tanh"
    num_labels: int = 0
    projection_dim: int = 0
    model_type: str = "vit"
    distillation_token: bool = False
    distilled_head: bool = False
    register_tokens: int = 0

    def __post_init__(self) -> None:
        if self.register_tokens and self.model_type != "dinov2_with_registers":
            raise ValueError(f"register tokens are DINOv2's, not {self.model_type!r}'s")
        if self.projection_dim and not self.pooler:
            raise ValueError("a ViT vision tower (projection_dim > 0) projects the pooler output")
        if self.distilled_head and not (self.distillation_token and self.num_labels):
            raise ValueError(
                "a distilled head reads the distillation token: it needs one, and a classifier"
            )

    @property
    def dinov2(self) -> bool:
        """DINOv2, with or without registers."""
        return self.model_type in ("dinov2", "dinov2_with_registers")


LOGIT_SCALE_INIT = 2.6592  # log(1 / 0.07), CLIP's initial temperature


def normalise(x: jax.Array) -> jax.Array:
    """`x / |x|` over the last axis (embeddings onto the unit sphere)."""
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def zero_shot_head(
    embeds: jax.Array, class_embeds: jax.Array, logit_scale: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`exp(logit_scale) * cos(embeds [B, E], class_embeds [C, E])` -> logits `[B, C]`, and
    the normalised `embeds` they are linear in (the head's `features`)."""
    features = normalise(embeds)
    return jnp.exp(logit_scale) * (features @ normalise(class_embeds).T), features


def patch_conv(width: int, patch_size: int, use_bias: bool, dtype: jnp.dtype | None) -> nn.Conv:
    P = patch_size
    return nn.Conv(width, (P, P), strides=(P, P), padding="VALID", use_bias=use_bias, dtype=dtype)


def patchify(conv: nn.Conv, pixel_values: jax.Array) -> jax.Array:
    """`[B, C, H, W]` (HF layout) -> `[B, T, D]` patch embeddings, T = (H / P) * (W / P)."""
    x = conv(jnp.transpose(pixel_values, (0, 2, 3, 1)))  # [B, H, W, C] -> [B, H/P, W/P, D]
    return x.reshape(x.shape[0], -1, x.shape[-1])  # [B, T, D]


def bicubic_matrix(size_in: int, size_out: int) -> np.ndarray:
    """`[out, in]` weights that resize an axis as `torch.nn.functional.interpolate(...,
    mode="bicubic", align_corners=False)` does: source position `(i + 0.5) * in / out - 0.5`,
    Keys' cubic kernel with a = -0.75, indices clamped at the borders."""
    a = -0.75

    def near(x: float) -> float:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: float) -> float:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    matrix = np.zeros((size_out, size_in))
    for i in range(size_out):
        x = (i + 0.5) * size_in / size_out - 0.5
        start = math.floor(x)
        t = x - start
        for k, w in enumerate((far(t + 1), near(t), near(1 - t), far(2 - t))):
            matrix[i, min(max(start - 1 + k, 0), size_in - 1)] += w
    return matrix.astype(np.float32)


def resized_positions(positions: jax.Array, grid: tuple[int, int]) -> jax.Array:
    """DINOv2's position table `[1 + G * G, D]` (CLS first) for a patch grid `(h, w)`: the patch
    positions resized bicubically in float32, as `transformers` does for another image size."""
    G = math.isqrt(positions.shape[0] - 1)
    h, w = grid
    patches = positions[1:].reshape(G, G, -1).astype(jnp.float32)  # [G, G, D]
    resized = jnp.einsum("hH,wW,HWD->hwD", bicubic_matrix(G, h), bicubic_matrix(G, w), patches)
    return jnp.concatenate([positions[:1], resized.reshape(h * w, -1).astype(positions.dtype)])


def prepend(token: jax.Array, x: jax.Array) -> jax.Array:
    """`[D]` token before the `[B, T, D]` sequence -> `[B, T + 1, D]`."""
    B, _, D = x.shape
    return jnp.concatenate([jnp.broadcast_to(token, (B, 1, D)).astype(x.dtype), x], axis=1)


class ViT(StagedEncoder):
    """`embed` (patches, CLS, positions) -> `encode` -> `head` (final LN, pooler, classifier)."""

    config: ViTConfig

    def setup(self) -> None:
        c, e, dtype = self.config, self.config.encoder, hidden_dtype(self.config.encoder)
        T = (c.image_size // c.patch_size) ** 2
        self.patch = patch_conv(e.width, c.patch_size, use_bias=True, dtype=dtype)
        self.cls_token = self.param("cls_token", nn.initializers.normal(0.02), (e.width,))
        if c.distillation_token:
            init = nn.initializers.normal(0.02)
            self.distillation_token = self.param("distillation_token", init, (e.width,))
        if c.register_tokens:
            init = nn.initializers.zeros
            self.register_tokens = self.param("register_tokens", init, (c.register_tokens, e.width))
        tokens = T + 1 + c.distillation_token
        self.position_embeddings = self.param(
            "position_embeddings", nn.initializers.normal(0.02), (tokens, e.width)
        )
        self.encoder = Encoder(e)
        self.final_norm = LayerNorm(e.layer_norm_eps)
        if c.pooler:
            self.pooler = nn.Dense(e.width, dtype=dtype, dot_general=wide_dot)
        if c.projection_dim:  # a dual encoder's vision tower
            self.projection = nn.Dense(c.projection_dim, use_bias=False)
        if c.num_labels and c.projection_dim:  # zero-shot: fixed class embeddings
            init = nn.initializers.normal(0.02)
            self.class_embeds = self.param("class_embeds", init, (c.num_labels, c.projection_dim))
            scale = nn.initializers.constant(LOGIT_SCALE_INIT)
            self.logit_scale = self.param("logit_scale", scale, ())
        elif c.num_labels:
            self.classifier = nn.Dense(c.num_labels)
            if c.distilled_head:
                self.distillation_classifier = nn.Dense(c.num_labels)
        self.Dropout_0 = Dropout(e.dropout)  # the compact module's name: same RNG stream

    def embed(self, pixel_values: jax.Array, deterministic: bool = True) -> Stem:
        """`pixel_values`: `[B, C, H, W]` floats, as HF image processors produce them."""
        c = self.config
        x = patchify(self.patch, pixel_values)  # [B, T, D]
        if c.distillation_token:  # DeiT: [CLS, distillation, patches]
            x = prepend(self.distillation_token, x)
        x = prepend(self.cls_token, x)  # [B, T + 1 (+ 1), D]
        positions = self.position_embeddings
        H, W = pixel_values.shape[2:]
        grid = (H // c.patch_size, W // c.patch_size)
        if c.model_type == "dinov2" and not (x.shape[1] == positions.shape[0] and H == W):
            positions = resized_positions(positions, grid)  # as transformers: another size
        x = x + positions[None].astype(x.dtype)
        if c.register_tokens:  # [CLS, registers, patches]: registers carry no position
            B, R = x.shape[0], c.register_tokens
            registers = jnp.broadcast_to(self.register_tokens.astype(x.dtype), (B, R, x.shape[2]))
            x = jnp.concatenate([x[:, :1], registers, x[:, 1:]], axis=1)
        return Stem(self.Dropout_0(x, deterministic=deterministic))

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        del deterministic, key_mask  # no dropout after the encoder; no padding
        c = self.config
        x = self.final_norm(x)
        pooled = logits = embeds = features = None
        if c.pooler:
            pooled = ACTIVATIONS[c.pooler_activation](self.pooler(x[:, 0]))
        if c.projection_dim:
            embeds = self.projection(wide(pooled))  # [B, E]
        if c.num_labels and c.projection_dim:  # [B, C]
            logits, features = zero_shot_head(embeds, self.class_embeds, self.logit_scale)
        elif c.num_labels and c.dinov2:  # CLS and the mean patch: [B, 2D]
            patches = wide(x[:, 1 + c.register_tokens :]).mean(1)
            features = jnp.concatenate([wide(x[:, 0]), patches], -1)
            logits = self.classifier(features)
        elif c.num_labels:
            features = wide(x[:, 0])  # [B, D]
            logits = self.classifier(features)  # [B, C]
            if c.distilled_head:  # DeiT with its teacher's head: the mean of the two
                logits = (logits + self.distillation_classifier(wide(x[:, 1]))) / 2
                features = jnp.concatenate([features, wide(x[:, 1])], -1)  # [B, 2D]
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            logits=logits,
            embeds=embeds,
            features=features,
        )

    def __call__(
        self,
        pixel_values: jax.Array,
        *,
        head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> ModelOutput:
        stem = self.embed(pixel_values, deterministic)
        return self.run(stem, head_mask, output_attentions, deterministic, deterministic)
