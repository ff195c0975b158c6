"""BERT-family encoder (post-LN), tanh pooler and sequence classifier."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.config import BertConfig
from hydra_jax.models.encoder import Encoder, HeadMask, LayerNorm, stack_attentions
from hydra_jax.models.outputs import ModelOutput


class Bert(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        *,
        head_mask: HeadMask | None = None,
        output_attentions: bool = False,
        deterministic: bool = True,
    ) -> ModelOutput:
        """`input_ids`, `attention_mask`, `token_type_ids`: `[B, T]` integers."""
        c, e = self.config, self.config.encoder
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((B, T), jnp.int32)
        if token_type_ids is None:
            token_type_ids = jnp.zeros((B, T), jnp.int32)
        x = (
            nn.Embed(c.vocab_size, e.width, name="word_embeddings")(input_ids)
            + nn.Embed(c.max_positions, e.width, name="position_embeddings")(jnp.arange(T))[None]
            + nn.Embed(c.type_vocab_size, e.width, name="token_type_embeddings")(token_type_ids)
        )  # [B, T, D]
        x = LayerNorm(e.layer_norm_eps, name="embeddings_norm")(x)
        x = nn.Dropout(e.dropout)(x, deterministic=deterministic)
        bias = padding_bias(attention_mask, x.dtype)
        x, attentions = Encoder(e, name="encoder")(x, bias, head_mask, deterministic)

        pooled = logits = None
        if c.pooler:
            pooled = jnp.tanh(nn.Dense(e.width, name="pooler")(x[:, 0]))  # [B, D]
        if c.num_labels:
            rate = e.dropout if c.classifier_dropout is None else c.classifier_dropout
            h = nn.Dropout(rate)(pooled, deterministic=deterministic)
            logits = nn.Dense(c.num_labels, name="classifier")(h)  # [B, C]
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            logits=logits,
            attentions=stack_attentions(attentions) if output_attentions else None,
        )
