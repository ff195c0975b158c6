"""SigLIP: a bidirectional text tower pooled at its last token, a vision tower without a CLS
token pooled by multi-head attention from a learned probe, and sigmoid logits with a bias.

Each tower has the three stages (`embed`, `encode`, `head`). The vision tower also stands alone
as a model (`SiglipVisionTowerConfig`), optionally with a zero-shot head: fixed class embeddings
`[C, D]` scoring `exp(logit_scale) * cos(image embedding, class) + logit_bias`; and as HF's
image classifier (`SiglipClassifierConfig`): the mean token, a dense layer.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.clip import paired_output
from hydra_jax.models.config import EncoderConfig
from hydra_jax.models.dense import wide_dot, wide_dtype
from hydra_jax.models.encoder import (
    Encoder,
    HeadMask,
    StagedEncoder,
    hidden_dtype,
    layer_norm,
    mlp_block,
    wide,
)
from hydra_jax.models.outputs import CLIPOutput, ModelOutput, Stem
from hydra_jax.models.vit import normalise, patch_conv, patchify


@dataclasses.dataclass(frozen=True)
class SiglipTextConfig:
    """SigLIP's text tower: bidirectional pre-LN layers, a final LN, the last token's state
    through a dense layer (`head`, with a bias) to the `[B, E]` text embedding."""

    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    projection_dim: int


@dataclasses.dataclass(frozen=True)
class SiglipVisionConfig:
    """SigLIP's vision tower: patches (no CLS token) plus positions, pre-LN layers, a final LN
    and a multi-head attention-pooling head (a learned probe attending over every patch, then
    a LayerNorm'd MLP with a residual): its output `[B, D]` is the image embedding."""

    encoder: EncoderConfig
    image_size: int
    patch_size: int
    num_channels: int = 3


SIGLIP_LOGIT_SCALE_INIT = 2.302585  # log(10): SigLIP's training starts here
SIGLIP_LOGIT_BIAS_INIT = -10.0


@dataclasses.dataclass(frozen=True)
class SiglipConfig:
    """SigLIP: `logits_per_text = exp(logit_scale) * cos(text, image) + logit_bias`, read
    through a sigmoid (each text-image pair on its own), not a softmax."""

    text: SiglipTextConfig
    vision: SiglipVisionConfig
    logit_scale_init: float = SIGLIP_LOGIT_SCALE_INIT
    logit_bias_init: float = SIGLIP_LOGIT_BIAS_INIT


@dataclasses.dataclass(frozen=True)
class SiglipVisionTowerConfig:
    """SigLIP's vision tower as a model (outputs `embeds` `[B, D]`, the pooled image
    embedding). With `num_labels`, a zero-shot classifier: `logits = exp(logit_scale) *
    cos(embeds, class_embeds) + logit_bias` over fixed class embeddings `[C, D]`; SigLIP reads
    them through a sigmoid, our metrics through a softmax over the classes (the bias then
    cancels)."""

    vision: SiglipVisionConfig
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


@dataclasses.dataclass(frozen=True)
class SiglipClassifierConfig:
    """HF `SiglipForImageClassification`: SigLIP's vision tower without its attention-pooling
    head; the tokens after the final LayerNorm are averaged and a dense layer gives `num_labels`
    logits. `with_classifier` makes one from a SigLIP model, as `transformers` does from a
    SigLIP checkpoint."""

    vision: SiglipVisionConfig
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


class AttentionPool(nn.Module):
    """SigLIP's pooling head: a learned probe `[D]` attends over the tokens `[B, T, D]` with
    `N` heads of its own (torch's `nn.MultiheadAttention`), then `h + mlp(norm(h))`."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dtype = self.config, hidden_dtype(self.config)
        N, K = c.width // c.head_dim, c.head_dim  # the checkpoint's heads: none are pruned here
        probe = self.param("probe", nn.initializers.normal(0.02), (c.width,), jnp.float32)

        def projection(name: str) -> nn.DenseGeneral:
            return nn.DenseGeneral((N, K), dtype=dtype, dot_general=wide_dot, name=name)

        q = projection("query")(probe.astype(x.dtype)) / jnp.sqrt(K).astype(x.dtype)  # [N, K]
        k, v = projection("key")(x), projection("value")(x)  # [B, T, N, K]
        scores = jnp.einsum("NK,BTNK->BNT", q, k, preferred_element_type=wide_dtype(x.dtype))
        probs = jax.nn.softmax(scores, axis=-1)  # [B, N, T]
        context = jnp.einsum("BNT,BTNK->BNK", probs.astype(v.dtype), v)  # [B, N, K]
        h = nn.DenseGeneral(c.width, axis=(-2, -1), dtype=dtype, dot_general=wide_dot, name="out")(
            context
        )  # [B, D]
        return h + mlp_block(c, name="mlp")(layer_norm(c, name="norm")(h))


def sigmoid_logits(
    embeds: jax.Array, class_embeds: jax.Array, scale: jax.Array, bias: jax.Array
) -> jax.Array:
    """`exp(scale) * cos(embeds [B, E], class_embeds [C, E]) + bias` `[B, C]`, float32."""
    cos = normalise(wide(embeds)) @ normalise(class_embeds.astype(jnp.float32)).T
    return cos * jnp.exp(scale) + bias


class SiglipText(StagedEncoder):
    config: SiglipTextConfig

    def setup(self) -> None:
        c, e = self.config, self.config.encoder
        self.token_embedding = nn.Embed(c.vocab_size, e.width, dtype=hidden_dtype(e))
        self.position_embedding = nn.Embed(c.max_positions, e.width, dtype=hidden_dtype(e))
        self.encoder = Encoder(e)
        self.final_norm = layer_norm(e)
        self.projection = nn.Dense(c.projection_dim, dtype=hidden_dtype(e), dot_general=wide_dot)

    def embed(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> Stem:
        """`input_ids`, `attention_mask` `[B, T]`; SigLIP's tokenizer pads to a fixed length
        (64) and the embedding is the last position's, padding or not."""
        T = input_ids.shape[1]
        x = self.token_embedding(input_ids) + self.position_embedding(jnp.arange(T))[None]
        if attention_mask is None:
            return Stem(x)
        return Stem(x, padding_bias(attention_mask, x.dtype), attention_mask)

    def head(self, x: jax.Array) -> ModelOutput:
        x = self.final_norm(x)
        embeds = self.projection(x[:, -1])  # [B, E]
        return ModelOutput(last_hidden_state=x, pooler_output=embeds, embeds=wide(embeds))

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> ModelOutput:
        stem = self.embed(input_ids, attention_mask)
        return self.run(stem, head_mask, output_attentions, deterministic)


class SiglipVision(StagedEncoder):
    """The vision tower; with `num_labels`, a zero-shot classifier over fixed class embeddings."""

    config: SiglipVisionConfig
    num_labels: int = 0

    def setup(self) -> None:
        e = self.config.encoder
        self.setup_layers()
        self.pool = AttentionPool(e)
        if self.num_labels:
            init = nn.initializers.normal(0.02)
            self.class_embeds = self.param("class_embeds", init, (self.num_labels, e.width))
            self.logit_scale = self.param("logit_scale", nn.initializers.constant(0.0), ())
            self.logit_bias = self.param("logit_bias", nn.initializers.constant(0.0), ())

    def setup_layers(self) -> None:
        """Patches, positions, the layers and the final LayerNorm (every SigLIP vision model)."""
        c, e = self.config, self.config.encoder
        T = (c.image_size // c.patch_size) ** 2
        self.patch = patch_conv(e.width, c.patch_size, use_bias=True, dtype=hidden_dtype(e))
        self.position_embedding = nn.Embed(T, e.width, dtype=hidden_dtype(e))
        self.encoder = Encoder(e)
        self.post_norm = layer_norm(e)

    def embed(self, pixel_values: jax.Array, deterministic: bool = True) -> Stem:
        del deterministic  # no embedding dropout
        x = patchify(self.patch, pixel_values)  # [B, T, D]
        return Stem(x + self.position_embedding(jnp.arange(x.shape[1]))[None])

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        del deterministic, key_mask  # no dropout after the encoder; no padding
        x = self.post_norm(x)
        pooled = self.pool(x)  # [B, D]
        logits = features = None
        if self.num_labels:
            logits = sigmoid_logits(pooled, self.class_embeds, self.logit_scale, self.logit_bias)
            features = normalise(wide(pooled))  # logits are affine in it
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            logits=logits,
            embeds=wide(pooled),
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
        return self.run(self.embed(pixel_values), head_mask, output_attentions, deterministic)


class SiglipClassifier(SiglipVision):
    """HF `SiglipForImageClassification`: the vision tower's final-normed tokens averaged (its
    pooling head unused), then a dense classifier."""

    def setup(self) -> None:
        self.setup_layers()
        if self.num_labels:
            self.classifier = nn.Dense(self.num_labels)  # float32, on the float32 mean token

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        del deterministic, key_mask  # no dropout after the encoder; no padding
        x = self.post_norm(x)
        pooled = wide(x).mean(axis=1)  # [B, D]
        logits = self.classifier(pooled) if self.num_labels else None
        features = pooled if self.num_labels else None
        return ModelOutput(
            last_hidden_state=x, pooler_output=pooled, logits=logits, features=features
        )


class Siglip(nn.Module):
    config: SiglipConfig

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        pixel_values: jax.Array | None = None,
        *,
        text_head_mask: HeadMask | None = None,
        vision_head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> CLIPOutput:
        """Either tower may run alone; logits need both. `logits_per_text` `[B_text,
        B_image]` = `exp(logit_scale) * text @ image^T + logit_bias` (read with a sigmoid)."""
        c = self.config
        text_tower = SiglipText(c.text, name="text")
        vision_tower = SiglipVision(c.vision, name="vision")
        scale = self.param("logit_scale", nn.initializers.constant(c.logit_scale_init), ())
        bias = self.param("logit_bias", nn.initializers.constant(c.logit_bias_init), ())
        options = dict(output_attentions=output_attentions, deterministic=deterministic)
        text = vision = None
        if input_ids is not None:
            text = text_tower(input_ids, attention_mask, head_mask=text_head_mask, **options)
        if pixel_values is not None:
            vision = vision_tower(pixel_values, head_mask=vision_head_mask, **options)
        if self.is_initializing() and (text is None or vision is None):
            raise ValueError("SigLIP initialisation needs both input_ids and pixel_values")
        text_embeds = None if text is None else normalise(text.embeds)
        image_embeds = None if vision is None else normalise(vision.embeds)
        return paired_output(text, vision, text_embeds, image_embeds, scale, bias)
