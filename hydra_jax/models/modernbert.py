"""ModernBERT: a pre-LN text encoder without biases, with rotary positions (one base for global
layers, another for local ones), alternating global and sliding-window local attention and a
GeGLU MLP, all in the shared layer stack (`EncoderConfig.rotary`, `windows`, `gated_mlp`,
`first_norm`, the bias flags); its own embedding stage, final norm and classifier head here."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax.models.attention import padding_bias
from hydra_jax.models.config import EncoderConfig
from hydra_jax.models.dense import wide_dot
from hydra_jax.models.dropout import Dropout
from hydra_jax.models.encoder import (
    ACTIVATIONS,
    Encoder,
    HeadMask,
    StagedEncoder,
    hidden_dtype,
    layer_norm,
    wide,
)
from hydra_jax.models.outputs import ModelOutput, Stem

POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """A ModernBERT encoder; `num_labels == 0` means no sequence classifier.

    Attributes:
      max_positions: the longest sequence (`max_position_embeddings`; rotary positions have no
        table, this is the length the checkpoint was trained for).
      pooling: what the classifier reads, `cls` (the first token) or `mean` (the mean over real
        tokens), after the final norm.
      head_bias: whether the head's dense layer carries a bias (`classifier_bias`).
      head_activation: the head's activation (`classifier_activation`).
      classifier_dropout: dropout before the classifier.
      embedding_dropout: dropout after the embedding norm.
    """

    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    pad_token_id: int = 0
    num_labels: int = 0
    pooling: str = "cls"
    head_bias: bool = False
    head_activation: str = "gelu"
    classifier_dropout: float = 0.0
    embedding_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {POOLINGS}")

    @property
    def max_tokens(self) -> int:
        return self.max_positions


class ModernBert(StagedEncoder):
    """`embed` (token table + norm) -> `encode` (a layer range) -> `head` (final norm, pooling,
    dense + activation + norm, classifier)."""

    config: ModernBertConfig

    def setup(self) -> None:
        c, e = self.config, self.config.encoder
        self.word_embeddings = nn.Embed(c.vocab_size, e.width, dtype=hidden_dtype(e))
        self.embeddings_norm = layer_norm(e)
        self.encoder = Encoder(e)
        self.final_norm = layer_norm(e)
        if c.num_labels:
            self.pre_classifier = nn.Dense(
                e.width, c.head_bias, hidden_dtype(e), dot_general=wide_dot
            )
            self.head_norm = layer_norm(e)
            self.classifier = nn.Dense(c.num_labels)
        self.embedding_drop = Dropout(c.embedding_dropout)
        self.classifier_drop = Dropout(c.classifier_dropout)

    def embed(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        deterministic: bool = True,
    ) -> Stem:
        """`input_ids`, `attention_mask` `[B, T]`; `token_type_ids` are ignored (ModernBERT has
        none; a tokenizer may still give them for sentence pairs)."""
        del token_type_ids
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        x = self.embeddings_norm(self.word_embeddings(input_ids))  # [B, T, D]
        x = self.embedding_drop(x, deterministic=deterministic)
        return Stem(x, padding_bias(attention_mask, x.dtype), attention_mask)

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        """Final norm on `x` `[B, T, D]`; with a classifier, the pooled `[B, D]` (the first token,
        or the mean over `key_mask`'s real tokens) through the head to logits `[B, C]`."""
        c = self.config
        x = self.final_norm(x)
        logits = features = None
        if c.num_labels:
            if c.pooling == "cls":
                pooled = x[:, 0]
            else:
                real = (
                    jnp.ones(x.shape[:2], jnp.float32) if key_mask is None else key_mask
                ).astype(wide(x).dtype)[:, :, None]  # [B, T, 1]
                pooled = (wide(x) * real).sum(1) / real.sum(1)  # [B, D]
            h = ACTIVATIONS[c.head_activation](self.pre_classifier(pooled))
            features = self.classifier_drop(wide(self.head_norm(h)), deterministic=deterministic)
            logits = self.classifier(features)  # [B, C]
        return ModelOutput(last_hidden_state=x, logits=logits, features=features)

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
        return self.run(
            stem, head_mask, output_attentions, deterministic, deterministic, stem.key_mask
        )
