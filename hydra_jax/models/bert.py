"""BERT-family encoder (post-LN), tanh pooler and sequence classifier, in three stages."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.config import BertConfig
from hydra_jax.models.encoder import (
    Encoder,
    HeadMask,
    LayerNorm,
    StagedEncoder,
    compute_dtype,
    stack_attentions,
    wide,
)
from hydra_jax.models.outputs import ModelOutput, Stem


class Bert(StagedEncoder):
    """`embed` (tables + LayerNorm) -> `encode` (a layer range) -> `head` (pooler, classifier)."""

    config: BertConfig

    def setup(self) -> None:
        c, e, dtype = self.config, self.config.encoder, compute_dtype(self.config.encoder)
        self.word_embeddings = nn.Embed(c.vocab_size, e.width, dtype=dtype)
        self.position_embeddings = nn.Embed(c.max_positions, e.width, dtype=dtype)
        self.token_type_embeddings = nn.Embed(c.type_vocab_size, e.width, dtype=dtype)
        self.embeddings_norm = LayerNorm(e.layer_norm_eps)
        self.encoder = Encoder(e)
        if c.pooler:
            self.pooler = nn.Dense(e.width, dtype=dtype)
        if c.num_labels:
            self.classifier = nn.Dense(c.num_labels)
        # Flax derives a dropout module's RNG stream from its name; these are the names the
        # compact module gave them, so training draws the same masks as it always did.
        self.Dropout_0 = nn.Dropout(e.dropout)  # embeddings
        rate = e.dropout if c.classifier_dropout is None else c.classifier_dropout
        self.Dropout_1 = nn.Dropout(rate)  # classifier input

    def embed(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        deterministic: bool = True,
    ) -> Stem:
        """`input_ids`, `attention_mask`, `token_type_ids`: `[B, T]` integers."""
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((B, T), jnp.int32)
        if token_type_ids is None:
            token_type_ids = jnp.zeros((B, T), jnp.int32)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(jnp.arange(T))[None]
            + self.token_type_embeddings(token_type_ids)
        )  # [B, T, D]
        x = self.Dropout_0(self.embeddings_norm(x), deterministic=deterministic)
        return Stem(x, padding_bias(attention_mask, x.dtype), attention_mask)

    def head(self, x: jax.Array, deterministic: bool = True) -> ModelOutput:
        """Pooler (tanh of a dense layer on the [CLS] token) and classifier on `x` `[B, T, D]`."""
        c = self.config
        pooled = logits = None
        if c.pooler:
            pooled = jnp.tanh(self.pooler(x[:, 0]))  # [B, D]
        if c.num_labels:
            logits = self.classifier(self.Dropout_1(wide(pooled), deterministic=deterministic))
        return ModelOutput(last_hidden_state=x, pooler_output=pooled, logits=logits)  # [B, C]

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
        stem = self.embed(input_ids, attention_mask, token_type_ids, deterministic)
        x, attentions = self.encode(stem, head_mask, deterministic)
        out = self.head(x, deterministic)
        return out.replace(attentions=stack_attentions(attentions) if output_attentions else None)
