"""BERT-family encoder (post-LN), tanh pooler and sequence classifier."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.config import BertConfig
from hydra_jax.models.encoder import Encoder, HeadMask, LayerNorm, stack_attentions
from hydra_jax.models.outputs import ModelOutput


def embed_tokens(c: BertConfig, input_ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
    """Word + position + token-type embeddings `[B, T, D]`.

    Called inside a compact module (`Bert`, `Hydra`), whose parameters the tables become.
    """
    T, D = input_ids.shape[1], c.encoder.width
    return (
        nn.Embed(c.vocab_size, D, name="word_embeddings")(input_ids)
        + nn.Embed(c.max_positions, D, name="position_embeddings")(jnp.arange(T))[None]
        + nn.Embed(c.type_vocab_size, D, name="token_type_embeddings")(token_type_ids)
    )


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
        layers: tuple[int, int] | None = None,
        hidden_state: jax.Array | None = None,
    ) -> ModelOutput:
        """`input_ids`, `attention_mask`, `token_type_ids`: `[B, T]` integers.

        `layers = (start, stop)` runs part of the stack: from `hidden_state` `[B, T, D]` (the
        input of layer `start`; the embeddings when start is 0) up to layer `stop - 1`. Pooler
        and classifier run only when `stop` is the last layer; `last_hidden_state` is then the
        input of layer `stop`.
        """
        c, e = self.config, self.config.encoder
        B, T = input_ids.shape
        start, stop = layers or (0, e.num_layers)
        if attention_mask is None:
            attention_mask = jnp.ones((B, T), jnp.int32)
        if token_type_ids is None:
            token_type_ids = jnp.zeros((B, T), jnp.int32)
        if start == 0:
            x = embed_tokens(c, input_ids, token_type_ids)  # [B, T, D]
            x = LayerNorm(e.layer_norm_eps, name="embeddings_norm")(x)
            x = nn.Dropout(e.dropout)(x, deterministic=deterministic)
        elif hidden_state is None:
            raise ValueError(f"starting at layer {start} needs the hidden_state entering it")
        else:
            x = hidden_state
        bias = padding_bias(attention_mask, x.dtype)
        x, attentions = Encoder(e, name="encoder")(x, bias, head_mask, deterministic, (start, stop))

        pooled = logits = None
        if stop < e.num_layers:
            return ModelOutput(last_hidden_state=x)
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
