"""CLIP: causal text tower with EOS pooling, vision tower with CLS pooling, projections.

Each tower has the three stages (`embed`, `encode`, `head`). A vision tower also stands alone as
a model (`CLIPVisionTowerConfig`), optionally with a zero-shot head: fixed class embeddings
`[C, E]` (prompt embeddings) scoring `exp(logit_scale) * cos(image embedding, class)`.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.config import EncoderConfig
from hydra_jax.models.encoder import (
    Encoder,
    HeadMask,
    LayerNorm,
    StagedEncoder,
    hidden_dtype,
    wide,
)
from hydra_jax.models.outputs import CLIPOutput, ModelOutput, Stem
from hydra_jax.models.vit import (
    LOGIT_SCALE_INIT,
    normalise,
    patch_conv,
    patchify,
    prepend,
    zero_shot_head,
)


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    eos_token_id: int


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
    encoder: EncoderConfig
    image_size: int
    patch_size: int
    num_channels: int = 3


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    text: CLIPTextConfig
    vision: CLIPVisionConfig
    projection_dim: int
    logit_scale_init: float = 2.6592


@dataclasses.dataclass(frozen=True)
class CLIPVisionTowerConfig:
    """A CLIP vision tower as a model of its own (outputs `embeds` `[B, E]`, projected).

    With `num_labels`, a zero-shot classifier: `logits = exp(logit_scale) * cos(embeds,
    class_embeds)` over fixed class embeddings `[C, E]` (for example prompt-ensemble text
    embeddings), so scoring, pruning and fusion treat it like any classifier.
    """

    vision: CLIPVisionConfig
    projection_dim: int
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


@dataclasses.dataclass(frozen=True)
class CLIPClassifierConfig:
    """HF `CLIPForImageClassification`: CLIP's vision tower; the encoder's outputs at the patch
    tokens averaged (the CLS token's final LayerNorm and the projection unused), then a dense
    layer gives `num_labels` logits. `with_classifier` makes one from a CLIP model, as
    `transformers` does from a CLIP checkpoint."""

    vision: CLIPVisionConfig
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


def paired_output(
    text: ModelOutput | None,
    vision: ModelOutput | None,
    text_embeds: jax.Array | None,
    image_embeds: jax.Array | None,
    logit_scale: jax.Array,
    logit_bias: jax.Array | None = None,
) -> CLIPOutput:
    """A dual encoder's outputs from whichever towers ran (normalised embeddings `[B, E]`), with
    `logits_per_text` `[B_text, B_image]` = `exp(logit_scale) * text @ image^T` (`+ logit_bias`:
    SigLIP) when both did."""
    out = CLIPOutput(
        text_embeds=text_embeds,
        image_embeds=image_embeds,
        text_model_output=text,
        vision_model_output=vision,
    )
    if text_embeds is None or image_embeds is None:
        return out
    logits_per_text = text_embeds @ image_embeds.T * jnp.exp(logit_scale)
    if logit_bias is not None:
        logits_per_text = logits_per_text + logit_bias
    return out.replace(logits_per_text=logits_per_text, logits_per_image=logits_per_text.T)


class CLIPText(StagedEncoder):
    config: CLIPTextConfig
    projection_dim: int

    def setup(self) -> None:
        c, e, dtype = self.config, self.config.encoder, hidden_dtype(self.config.encoder)
        self.token_embedding = nn.Embed(c.vocab_size, e.width, dtype=dtype)
        self.position_embedding = nn.Embed(c.max_positions, e.width, dtype=dtype)
        self.encoder = Encoder(e)
        self.final_norm = LayerNorm(e.layer_norm_eps)
        self.projection = nn.Dense(self.projection_dim, use_bias=False)

    def embed(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> Stem:
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((B, T), jnp.int32)
        x = self.token_embedding(input_ids) + self.position_embedding(jnp.arange(T))[None]
        return Stem(x, padding_bias(attention_mask, x.dtype, causal=True), attention_mask)

    def head(self, x: jax.Array, input_ids: jax.Array) -> ModelOutput:
        x = self.final_norm(x)
        # `transformers` pools the first EOS token; checkpoints with the legacy eos id 2 pool the
        # highest token id instead (the EOS of the original CLIP vocabulary).
        if self.config.eos_token_id == 2:
            eos = jnp.argmax(input_ids, axis=-1)
        else:
            eos = jnp.argmax(input_ids == self.config.eos_token_id, axis=-1)
        pooled = x[jnp.arange(x.shape[0]), eos]  # [B, D]
        embeds = self.projection(wide(pooled))  # [B, E]
        return ModelOutput(last_hidden_state=x, pooler_output=pooled, embeds=embeds)

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
        return self.run(stem, head_mask, output_attentions, deterministic, input_ids)


class CLIPVision(StagedEncoder):
    """The vision tower; with `num_labels`, a zero-shot classifier over fixed class embeddings."""

    config: CLIPVisionConfig
    projection_dim: int
    num_labels: int = 0

    def setup(self) -> None:
        e = self.config.encoder
        self.setup_layers()
        self.post_norm = LayerNorm(e.layer_norm_eps)
        self.projection = nn.Dense(self.projection_dim, use_bias=False)
        if self.num_labels:
            E = self.projection_dim
            init = nn.initializers.normal(0.02)
            self.class_embeds = self.param("class_embeds", init, (self.num_labels, E))
            scale = nn.initializers.constant(LOGIT_SCALE_INIT)
            self.logit_scale = self.param("logit_scale", scale, ())

    def setup_layers(self) -> None:
        """Patches, CLS, positions, the first LayerNorm and the layers (every CLIP vision model)."""
        c, e, dtype = self.config, self.config.encoder, hidden_dtype(self.config.encoder)
        T = (c.image_size // c.patch_size) ** 2
        self.patch = patch_conv(e.width, c.patch_size, use_bias=False, dtype=dtype)
        self.class_embedding = self.param(
            "class_embedding", nn.initializers.normal(0.02), (e.width,)
        )
        self.position_embedding = nn.Embed(T + 1, e.width, dtype=dtype)
        self.pre_norm = LayerNorm(e.layer_norm_eps)
        self.encoder = Encoder(e)

    def embed(self, pixel_values: jax.Array, deterministic: bool = True) -> Stem:
        del deterministic  # no dropout in the CLIP vision embedding
        x = prepend(self.class_embedding, patchify(self.patch, pixel_values))  # [B, T+1, D]
        positions = self.position_embedding(jnp.arange(x.shape[1]))
        return Stem(self.pre_norm(x + positions[None]))

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        del deterministic, key_mask  # no dropout after the encoder; no padding
        pooled = self.post_norm(x[:, 0])  # [B, D]
        embeds = self.projection(wide(pooled))  # [B, E]
        logits = features = None
        if self.num_labels:  # [B, C]
            logits, features = zero_shot_head(embeds, self.class_embeds, self.logit_scale)
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
        return self.run(self.embed(pixel_values), head_mask, output_attentions, deterministic)


class CLIPClassifier(CLIPVision):
    """HF `CLIPForImageClassification`: the mean of the encoder's outputs at the patch tokens
    (no final LayerNorm, no projection), then a dense classifier."""

    projection_dim: int = 0

    def setup(self) -> None:
        self.setup_layers()
        if self.num_labels:
            self.classifier = nn.Dense(self.num_labels)  # float32, on the float32 mean

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        del deterministic, key_mask  # no dropout after the encoder; no padding
        pooled = wide(x[:, 1:]).mean(axis=1)  # [B, D]: the patch tokens, CLS left out
        logits = self.classifier(pooled) if self.num_labels else None
        features = pooled if self.num_labels else None
        return ModelOutput(
            last_hidden_state=x, pooler_output=pooled, logits=logits, features=features
        )


class CLIP(nn.Module):
    config: CLIPConfig

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
        """Either tower may be run alone; logits need both."""
        c = self.config
        text_tower = CLIPText(c.text, c.projection_dim, name="text")
        vision_tower = CLIPVision(c.vision, c.projection_dim, name="vision")
        logit_scale = self.param("logit_scale", nn.initializers.constant(c.logit_scale_init), ())
        options = dict(output_attentions=output_attentions, deterministic=deterministic)
        text = vision = None
        if input_ids is not None:
            text = text_tower(input_ids, attention_mask, head_mask=text_head_mask, **options)
        if pixel_values is not None:
            vision = vision_tower(pixel_values, head_mask=vision_head_mask, **options)
        if self.is_initializing() and (text is None or vision is None):
            raise ValueError("CLIP initialisation needs both input_ids and pixel_values")
        text_embeds = None if text is None else normalise(text.embeds)
        image_embeds = None if vision is None else normalise(vision.embeds)
        return paired_output(text, vision, text_embeds, image_embeds, logit_scale)
