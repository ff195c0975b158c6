"""BERT-family encoders (post-LN: BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT,
DeBERTa-v2/v3), their poolers and sequence classifiers, in three stages. `BertConfig.variant`
says how a family differs from BERT: where positions start, which classifier head it has, and
whether its embedding stage is DeBERTa's (whose attention, `EncoderConfig.relative`, lives in
the shared layer stack)."""

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
    LayerNorm,
    StagedEncoder,
    hidden_dtype,
    wide,
)
from hydra_jax.models.outputs import ModelOutput, Stem


@dataclasses.dataclass(frozen=True)
class TextVariant:
    """How a BERT-family checkpoint differs from BERT itself (its encoder layers do not).

    Attributes:
      positions_after_padding: position ids count the real tokens of each row, starting at
        `pad_token_id + 1` (RoBERTa); else 0..T-1.
      head: the sequence classifier on the first token's final state: `pooler` (BERT: the tanh
        pooler, dropout, a dense layer), `tanh` / `gelu` (RoBERTa / ELECTRA / DeBERTa: dropout,
        a dense layer, the activation, dropout, a dense layer), `relu` (DistilBERT: a dense
        layer, ReLU, dropout, a dense layer).
      disentangled: DeBERTa's embedding stage: the tables' sum projected (no bias) to the
        encoder's width before its LayerNorm, padding tokens' embeddings zeroed, and padding
        queries masked as well as padding keys (their rows attend uniformly).
    """

    positions_after_padding: bool
    head: str
    disentangled: bool = False


# HF `model_type` -> how it differs from BERT. XLM-RoBERTa and CamemBERT are RoBERTa networks.
TEXT_VARIANTS = {
    "bert": TextVariant(positions_after_padding=False, head="pooler"),
    "roberta": TextVariant(positions_after_padding=True, head="tanh"),
    "xlm-roberta": TextVariant(positions_after_padding=True, head="tanh"),
    "camembert": TextVariant(positions_after_padding=True, head="tanh"),
    "electra": TextVariant(positions_after_padding=False, head="gelu"),
    "distilbert": TextVariant(positions_after_padding=False, head="relu"),
    "deberta-v2": TextVariant(positions_after_padding=False, head="gelu", disentangled=True),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT,
    DeBERTa-v2/v3: one post-LN layer stack, `model_type` names the variant); `num_labels == 0`
    means no sequence classifier.

    Attributes:
      type_vocab_size: token types; 0 for none (DistilBERT: no `token_type_ids` input).
      embedding_size: the width of the token tables when it differs from the encoder's,
        projected to it (`embeddings_project`: ELECTRA's, or DeBERTa's without a bias); 0 for
        the encoder's width.
      absolute_positions: a table of absolute positions added to the token embeddings (DeBERTa
        can go without: `position_biased_input`; its attention then sees only distances).
      pre_classifier_dropout: a two-layer head's dropout before its first dense layer (DeBERTa's
        `pooler_dropout`); None for `classifier_dropout`.
    """

    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    type_vocab_size: int
    pad_token_id: int = 0
    pooler: bool = True
    num_labels: int = 0
    classifier_dropout: float | None = None
    model_type: str = "bert"
    embedding_size: int = 0
    absolute_positions: bool = True
    pre_classifier_dropout: float | None = None

    def __post_init__(self) -> None:
        if self.model_type not in TEXT_VARIANTS:
            raise ValueError(
                f"model_type {self.model_type!r} is not one of {sorted(TEXT_VARIANTS)}"
            )
        if (self.encoder.relative is not None) != self.variant.disentangled:
            raise ValueError(
                f"a {self.model_type} encoder {'needs' if self.variant.disentangled else 'has no'}"
                " relative (disentangled) attention"
            )

    @property
    def variant(self) -> TextVariant:
        return TEXT_VARIANTS[self.model_type]

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table serves."""
        offset = self.pad_token_id + 1 if self.variant.positions_after_padding else 0
        return self.max_positions - offset


class Bert(StagedEncoder):
    """`embed` (tables + LayerNorm) -> `encode` (a layer range) -> `head` (pooler, classifier)."""

    config: BertConfig

    def setup(self) -> None:
        c, e, dtype = self.config, self.config.encoder, hidden_dtype(self.config.encoder)
        E = c.embedding_size or e.width
        self.word_embeddings = nn.Embed(c.vocab_size, E, dtype=dtype)
        if c.absolute_positions:
            self.position_embeddings = nn.Embed(c.max_positions, E, dtype=dtype)
        if c.type_vocab_size:
            self.token_type_embeddings = nn.Embed(c.type_vocab_size, E, dtype=dtype)
        self.embeddings_norm = LayerNorm(e.layer_norm_eps)
        if c.embedding_size:
            bias = not c.variant.disentangled  # DeBERTa's projection has no bias
            self.embeddings_project = nn.Dense(e.width, bias, dtype, dot_general=wide_dot)
        self.encoder = Encoder(e)
        if c.pooler:
            self.pooler = nn.Dense(e.width, dtype=dtype, dot_general=wide_dot)
        if c.num_labels:
            if c.variant.head != "pooler":
                self.pre_classifier = nn.Dense(e.width, dtype=dtype, dot_general=wide_dot)
            self.classifier = nn.Dense(c.num_labels)
        # Flax derives a dropout module's RNG stream from its name; these are the names the
        # compact module gave them, so training draws the same masks as it always did.
        self.Dropout_0 = Dropout(e.dropout)  # embeddings
        rate = e.dropout if c.classifier_dropout is None else c.classifier_dropout
        self.Dropout_1 = Dropout(rate)  # classifier input
        if c.pre_classifier_dropout is not None:  # DeBERTa's pooler dropout
            self.pre_classifier_drop = Dropout(c.pre_classifier_dropout)

    def embed(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        token_type_ids: jax.Array | None = None,
        deterministic: bool = True,
    ) -> Stem:
        """`input_ids`, `attention_mask`, `token_type_ids`: `[B, T]` integers."""
        c = self.config
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((B, T), jnp.int32)
        x = self.word_embeddings(input_ids)  # [B, T, E]
        if c.absolute_positions:
            x = x + self._positions(input_ids)
        if c.type_vocab_size:
            if token_type_ids is None:
                token_type_ids = jnp.zeros((B, T), jnp.int32)
            x = x + self.token_type_embeddings(token_type_ids)
        if c.variant.disentangled:  # DeBERTa: project, normalise, zero the padding
            if c.embedding_size:
                x = self.embeddings_project(x)  # [B, T, D]
            real = attention_mask.astype(x.dtype)[:, :, None]  # [B, T, 1]
            x = self.Dropout_0(self.embeddings_norm(x) * real, deterministic=deterministic)
            bias = padding_bias(attention_mask, x.dtype, queries=True)
            return Stem(x, bias, attention_mask)
        x = self.Dropout_0(self.embeddings_norm(x), deterministic=deterministic)
        if c.embedding_size:
            x = self.embeddings_project(x)  # [B, T, D]
        return Stem(x, padding_bias(attention_mask, x.dtype), attention_mask)

    def _positions(self, input_ids: jax.Array) -> jax.Array:
        """Absolute position embeddings `[B or 1, T, E]`."""
        c = self.config
        if c.variant.positions_after_padding:  # RoBERTa: real tokens count from pad + 1
            real = (input_ids != c.pad_token_id).astype(jnp.int32)  # [B, T]
            return self.position_embeddings(jnp.cumsum(real, -1) * real + c.pad_token_id)
        return self.position_embeddings(jnp.arange(input_ids.shape[1]))[None]

    def head(
        self, x: jax.Array, deterministic: bool = True, key_mask: jax.Array | None = None
    ) -> ModelOutput:
        """Pooler (tanh of a dense layer on the first token) and the family's classifier on
        `x` `[B, T, D]` (`key_mask`: unused, every family's head takes it)."""
        del key_mask
        c = self.config
        pooled = logits = features = None
        if c.pooler:
            pooled = jnp.tanh(self.pooler(x[:, 0]))  # [B, D]
        if c.num_labels:
            features = self._classifier_input(x, pooled, deterministic)  # [B, D]
            logits = self.classifier(features)  # [B, C]
        return ModelOutput(
            last_hidden_state=x, pooler_output=pooled, logits=logits, features=features
        )

    def _classifier_input(
        self, x: jax.Array, pooled: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        """What the final dense layer reads `[B, D]` (float32), by the family's head."""
        head, drop = self.config.variant.head, self.Dropout_1
        if head == "pooler":
            return drop(wide(pooled), deterministic=deterministic)
        first = x[:, 0]  # [B, D]
        if head == "relu":  # DistilBERT: no dropout before its pre-classifier
            h = jax.nn.relu(self.pre_classifier(first))
        else:
            own = self.config.pre_classifier_dropout is not None
            before = self.pre_classifier_drop if own else drop
            h = self.pre_classifier(before(first, deterministic=deterministic))
            h = jnp.tanh(h) if head == "tanh" else ACTIVATIONS["gelu"](h)
        return drop(wide(h), deterministic=deterministic)

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
        return self.run(stem, head_mask, output_attentions, deterministic, deterministic)
