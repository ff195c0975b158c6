"""Output pytrees; field names follow `transformers`."""

from __future__ import annotations

import jax
from flax import struct


@struct.dataclass
class ModelOutput:
    """Outputs of a BERT or ViT model or of one CLIP tower.

    Attributes:
      last_hidden_state: `[B, T, D]`.
      pooler_output: `[B, D]` (BERT/ViT pooler, CLIP post-LN EOS/CLS token) or None.
      logits: `[B, C]` with a classifier, else None.
      attentions: `[L, B, N, T, S]` when requested (a per-layer tuple if head counts differ).
      embeds: `[B, E]` projected (not normalised) CLIP tower embedding, else None.
      features: `[B, F]` float32, what the final linear classifier reads (`logits = features @
        W + b`; a zero-shot classifier's normalised image embedding), with a classifier, else
        None: the penultimate features of feature-space OOD detectors.
    """

    last_hidden_state: jax.Array
    pooler_output: jax.Array | None = None
    logits: jax.Array | None = None
    attentions: jax.Array | tuple[jax.Array, ...] | None = None
    embeds: jax.Array | None = None
    features: jax.Array | None = None


@struct.dataclass
class CLIPOutput:
    """CLIP outputs; a tower that was not given inputs is None (and so are the logits).

    Attributes:
      text_embeds: `[B, E]` L2-normalised.
      image_embeds: `[B, E]` L2-normalised.
      logits_per_image: `[B_image, B_text]`, scaled by `exp(logit_scale)`.
      logits_per_text: `[B_text, B_image]`.
    """

    text_embeds: jax.Array | None = None
    image_embeds: jax.Array | None = None
    logits_per_image: jax.Array | None = None
    logits_per_text: jax.Array | None = None
    text_model_output: ModelOutput | None = None
    vision_model_output: ModelOutput | None = None


@struct.dataclass
class Stem:
    """What a model's `embed` stage hands to `encode`: the hidden state entering layer 0 and the
    key-padding information that every layer shares, taken from the model's own inputs.

    Attributes:
      hidden: `[B, T, D]`.
      bias: `[B, 1, T, S]` additive attention bias, or None (every key visible: images).
      key_mask: `[B, S]` 1 for real keys, or None (every key real).
    """

    hidden: jax.Array
    bias: jax.Array | None = None
    key_mask: jax.Array | None = None

    def replace_hidden(self, hidden: jax.Array) -> Stem:
        return self.replace(hidden=hidden)
