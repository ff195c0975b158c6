"""CLIP: causal text tower with EOS pooling, vision tower with CLS pooling, projections."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.config import CLIPConfig, CLIPTextConfig, CLIPVisionConfig
from hydra_jax.models.encoder import Encoder, HeadMask, LayerNorm, stack_attentions
from hydra_jax.models.outputs import CLIPOutput, ModelOutput
from hydra_jax.models.vit import patchify


class CLIPText(nn.Module):
    config: CLIPTextConfig
    projection_dim: int

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None,
        head_mask: HeadMask | None,
        output_attentions: bool,
        deterministic: bool,
    ) -> ModelOutput:
        c, e = self.config, self.config.encoder
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((B, T), jnp.int32)
        x = (
            nn.Embed(c.vocab_size, e.width, name="token_embedding")(input_ids)
            + nn.Embed(c.max_positions, e.width, name="position_embedding")(jnp.arange(T))[None]
        )  # [B, T, D]
        bias = padding_bias(attention_mask, x.dtype, causal=True)
        x, attentions = Encoder(e, name="encoder")(x, bias, head_mask, deterministic)
        x = LayerNorm(e.layer_norm_eps, name="final_norm")(x)
        # `transformers` pools the first EOS token; checkpoints with the legacy eos id 2 pool the
        # highest token id instead (the EOS of the original CLIP vocabulary).
        if c.eos_token_id == 2:
            eos = jnp.argmax(input_ids, axis=-1)
        else:
            eos = jnp.argmax(input_ids == c.eos_token_id, axis=-1)
        pooled = x[jnp.arange(B), eos]  # [B, D]
        embeds = nn.Dense(self.projection_dim, use_bias=False, name="projection")(pooled)
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            attentions=stack_attentions(attentions) if output_attentions else None,
            embeds=embeds,
        )


class CLIPVision(nn.Module):
    config: CLIPVisionConfig
    projection_dim: int

    @nn.compact
    def __call__(
        self,
        pixel_values: jax.Array,
        head_mask: HeadMask | None,
        output_attentions: bool,
        deterministic: bool,
    ) -> ModelOutput:
        c, e = self.config, self.config.encoder
        x = patchify(pixel_values, e.width, c.patch_size, use_bias=False)
        B, T = x.shape[:2]
        cls = self.param("class_embedding", nn.initializers.normal(0.02), (e.width,))
        x = jnp.concatenate([jnp.broadcast_to(cls, (B, 1, e.width)).astype(x.dtype), x], axis=1)
        pos = nn.Embed(T + 1, e.width, name="position_embedding")(jnp.arange(T + 1))
        x = LayerNorm(e.layer_norm_eps, name="pre_norm")(x + pos[None])  # [B, T+1, D]
        bias = jnp.zeros((B, 1, T + 1, T + 1), x.dtype)
        x, attentions = Encoder(e, name="encoder")(x, bias, head_mask, deterministic)
        pooled = LayerNorm(e.layer_norm_eps, name="post_norm")(x[:, 0])  # [B, D]
        embeds = nn.Dense(self.projection_dim, use_bias=False, name="projection")(pooled)
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            attentions=stack_attentions(attentions) if output_attentions else None,
            embeds=embeds,
        )


def _normalise(x: jax.Array) -> jax.Array:
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


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
        text = vision = None
        if input_ids is not None:
            text = text_tower(
                input_ids, attention_mask, text_head_mask, output_attentions, deterministic
            )
        if pixel_values is not None:
            vision = vision_tower(pixel_values, vision_head_mask, output_attentions, deterministic)
        if self.is_initializing() and (text is None or vision is None):
            raise ValueError("CLIP initialisation needs both input_ids and pixel_values")
        out = CLIPOutput(
            text_embeds=None if text is None else _normalise(text.embeds),
            image_embeds=None if vision is None else _normalise(vision.embeds),
            text_model_output=text,
            vision_model_output=vision,
        )
        if text is None or vision is None:
            return out
        logits_per_text = out.text_embeds @ out.image_embeds.T * jnp.exp(logit_scale)
        return out.replace(logits_per_text=logits_per_text, logits_per_image=logits_per_text.T)
