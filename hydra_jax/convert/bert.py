"""HuggingFace BERT (BertModel, BertForSequenceClassification) <-> ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra_jax.convert.common import (
    ConversionError,
    Rule,
    attention,
    check_fields,
    dense,
    encoder_config,
    encoder_hf_fields,
    expand,
    field,
    label_fields,
    layer_norm,
    load_model,
    num_labels,
    require,
    strip_prefix,
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import BertConfig, Model

HANDLED = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "position_embedding_type",
    "classifier_dropout", "pad_token_id",
)  # fmt: skip

# HF tensors that carry nothing we model: a buffer and BERT's pre-training heads.
IGNORED = (r"embeddings\.position_ids", r"cls\..*")

_LAYER = "encoder.layer.{l}"
_OURS = "encoder/layer_{l}"
BACKBONE_RULES = [
    Rule("embeddings.word_embeddings.weight", "word_embeddings/embedding"),
    Rule("embeddings.position_embeddings.weight", "position_embeddings/embedding"),
    Rule("embeddings.token_type_embeddings.weight", "token_type_embeddings/embedding"),
    *layer_norm("embeddings.LayerNorm", "embeddings_norm"),
    *attention(
        tuple(f"{_LAYER}.attention.self.{n}" for n in ("query", "key", "value")),
        f"{_LAYER}.attention.output.dense",
        f"{_OURS}/attention",
    ),
    *layer_norm(f"{_LAYER}.attention.output.LayerNorm", f"{_OURS}/attention_norm"),
    *dense(f"{_LAYER}.intermediate.dense", f"{_OURS}/mlp/fc1"),
    *dense(f"{_LAYER}.output.dense", f"{_OURS}/mlp/fc2"),
    *layer_norm(f"{_LAYER}.output.LayerNorm", f"{_OURS}/mlp_norm"),
]
POOLER_RULES = dense("pooler.dense", "pooler")
CLASSIFIER_RULES = dense("classifier", "classifier")


def config_from_hf(hf: dict[str, Any], has_pooler: bool) -> BertConfig:
    check_fields(hf, HANDLED, "BERT")
    position = field(hf, "position_embedding_type", str, "absolute")
    require(position == "absolute", f"BERT position_embedding_type={position!r}: only 'absolute'")
    classifier_dropout = field(hf, "classifier_dropout", float, None)
    labels = num_labels(hf, "ForSequenceClassification")
    require(
        has_pooler or not labels,
        "checkpoint is missing tensor 'pooler.dense.weight': a BertForSequenceClassification "
        "classifier reads the pooler",
    )
    return BertConfig(
        encoder=encoder_config(hf, "BERT", pre_norm=False, dropout_default=0.1),
        vocab_size=field(hf, "vocab_size", int),
        max_positions=field(hf, "max_position_embeddings", int, 512),
        type_vocab_size=field(hf, "type_vocab_size", int, 2),
        pad_token_id=field(hf, "pad_token_id", int, 0),
        pooler=has_pooler,
        num_labels=labels,
        classifier_dropout=None if classifier_dropout is None else float(classifier_dropout),
    )


def rules_for(config: BertConfig) -> list[Rule]:
    rules = list(BACKBONE_RULES)
    if config.pooler:
        rules += POOLER_RULES
    if config.num_labels:
        rules += CLASSIFIER_RULES
    return expand(rules, config.encoder.num_layers)


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    tensors = strip_prefix(tensors, "bert.")
    config = config_from_hf(hf, has_pooler="pooler.dense.weight" in tensors)
    return load_model(config, rules_for(config), tensors, IGNORED)


def hf_config(c: BertConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    e = c.encoder
    return {
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification" if c.num_labels else "BertModel"],
        **encoder_hf_fields(e, "BERT"),
        "vocab_size": c.vocab_size,
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "max_position_embeddings": c.max_positions,
        "type_vocab_size": c.type_vocab_size,
        "pad_token_id": c.pad_token_id,
        "classifier_dropout": c.classifier_dropout,
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, BertConfig):
        raise ConversionError(f"expected a BERT model, got {type(c).__name__}")
    hf = hf_config(c)
    prefix = "bert." if c.num_labels else ""
    write_hf(path, hf, to_hf_tensors(rules_for(c), model.params, prefix))
