"""HF's `VisionTextDualEncoderModel`: a ViT and a BERT, pooled, projected, compared by cosine.

`image_embeds = normalise(visual_projection(ViT pooler output))`, `text_embeds =
normalise(text_projection(BERT pooler output))`, `logits_per_image = exp(logit_scale) *
image_embeds @ text_embeds^T`: exactly `transformers`' computation, with CLIP's output names.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from hydra_jax.models.bert import Bert, BertConfig
from hydra_jax.models.clip import paired_output
from hydra_jax.models.encoder import HeadMask, wide
from hydra_jax.models.outputs import CLIPOutput
from hydra_jax.models.vit import ViT, ViTConfig, normalise


@dataclasses.dataclass(frozen=True)
class DualEncoderConfig:
    """HF `VisionTextDualEncoderModel`: a ViT and a BERT, each pooled and projected to E.

    `vision.projection_dim` is 0: the projections belong to the dual encoder, as in HF
    (`visual_projection`, `text_projection`); `vision_tower` moves one into the tower.
    """

    vision: ViTConfig
    text: BertConfig
    projection_dim: int
    logit_scale_init: float = 2.6592


class DualEncoder(nn.Module):
    config: DualEncoderConfig

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        pixel_values: jax.Array | None = None,
        *,
        text_head_mask: HeadMask | None = None,
        vision_head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> CLIPOutput:
        """Either tower may run alone (`text_embeds` or `image_embeds`); logits need both."""
        c = self.config
        vision_model = ViT(c.vision, name="vision_model")
        text_model = Bert(c.text, name="text_model")
        visual_projection = nn.Dense(c.projection_dim, use_bias=False, name="visual_projection")
        text_projection = nn.Dense(c.projection_dim, use_bias=False, name="text_projection")
        logit_scale = self.param("logit_scale", nn.initializers.constant(c.logit_scale_init), ())
        options = dict(output_attentions=output_attentions, deterministic=deterministic)
        text = vision = text_embeds = image_embeds = None
        if input_ids is not None:
            text = text_model(
                input_ids, attention_mask, token_type_ids, head_mask=text_head_mask, **options
            )
            text_embeds = normalise(text_projection(wide(text.pooler_output)))  # [B_text, E]
        if pixel_values is not None:
            vision = vision_model(pixel_values, head_mask=vision_head_mask, **options)
            image_embeds = normalise(visual_projection(wide(vision.pooler_output)))  # [B_image, E]
        if self.is_initializing() and (text is None or vision is None):
            raise ValueError("dual encoder initialisation needs both input_ids and pixel_values")
        return paired_output(text, vision, text_embeds, image_embeds, logit_scale)
