"""HuggingFace BERT-family checkpoints with BERT's tensor names <-> ours: BERT, RoBERTa,
XLM-RoBERTa, CamemBERT and ELECTRA (`...Model`, `...ForSequenceClassification`; an ELECTRA
`...ForPreTraining` discriminator loads as its backbone)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra_jax.convert.common import (
    ENCODER_FIELDS,
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
    *ENCODER_FIELDS,
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "position_embedding_type",
    "classifier_dropout",
    "pad_token_id",
)
# ELECTRA's own fields: its table width, and the sequence summary of its multiple-choice head
# (which we do not model).
ELECTRA_HANDLED = (
    "embedding_size",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_last_dropout",
)


@dataclasses.dataclass(frozen=True)
class Family:
    """An HF `model_type` with BERT's tensor names: its class-name stem, the backbone's prefix in
    a classifier checkpoint, and its default padding id."""

    stem: str
    prefix: str
    pad_token_id: int = 0


FAMILIES = {
    "bert": Family("Bert", "bert."),
    "roberta": Family("Roberta", "roberta.", pad_token_id=1),
    "xlm-roberta": Family("XLMRoberta", "roberta.", pad_token_id=1),
    "camembert": Family("Camembert", "roberta.", pad_token_id=1),
    "electra": Family("Electra", "electra."),
}
MODEL_TYPES = tuple(FAMILIES)  # the HF `model_type`s this converter reads

# HF tensors that carry nothing we model: buffers and pre-training heads (BERT's `cls`,
# RoBERTa's `lm_head`, ELECTRA's generator and replaced-token discriminator head).
IGNORED = (
    r"embeddings\.(position_ids|token_type_ids)",
    r"cls\..*",
    r"lm_head\..*",
    r"generator.*",
    r"discriminator_predictions\..*",
)

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
# RoBERTa's and ELECTRA's classification head: `classifier.dense`, then `classifier.out_proj`.
TWO_LAYER_CLASSIFIER_RULES = [
    *dense("classifier.dense", "pre_classifier"),
    *dense("classifier.out_proj", "classifier"),
]


def config_from_hf(hf: dict[str, Any], has_pooler: bool) -> BertConfig:
    model_type = field(hf, "model_type", str, "bert")  # (a dual encoder's text config may omit it)
    require(
        model_type in FAMILIES,
        f"a BERT-named text model_type {model_type!r} is not one of {sorted(FAMILIES)}",
    )
    family = FAMILIES[model_type]
    where = family.stem.upper()
    electra = model_type == "electra"
    check_fields(hf, HANDLED + ELECTRA_HANDLED if electra else HANDLED, where)
    position = field(hf, "position_embedding_type", str, "absolute")
    require(
        position == "absolute", f"{where} position_embedding_type={position!r}: only 'absolute'"
    )
    classifier_dropout = field(hf, "classifier_dropout", float, None)
    labels = num_labels(hf, "ForSequenceClassification")
    require(
        has_pooler or not labels or model_type != "bert",
        "checkpoint is missing tensor 'pooler.dense.weight': a BertForSequenceClassification "
        "classifier reads the pooler",
    )
    encoder = encoder_config(hf, where, pre_norm=False, dropout_default=0.1)
    embedding_size = field(hf, "embedding_size", int, encoder.width) if electra else encoder.width
    require(embedding_size > 0, f"{where} embedding_size must be positive, got {embedding_size}")
    config = BertConfig(
        encoder=encoder,
        vocab_size=field(hf, "vocab_size", int),
        max_positions=field(hf, "max_position_embeddings", int, 512),
        type_vocab_size=field(hf, "type_vocab_size", int, 2),
        pad_token_id=field(hf, "pad_token_id", int, family.pad_token_id),
        pooler=has_pooler,
        num_labels=labels,
        classifier_dropout=None if classifier_dropout is None else float(classifier_dropout),
        model_type=model_type,
        embedding_size=0 if embedding_size == encoder.width else embedding_size,
    )
    require(
        config.max_tokens > 0,
        f"{where} max_position_embeddings={config.max_positions} "
        f"leaves no position after the padding id {config.pad_token_id}",
    )
    return config


def rules_for(config: BertConfig) -> list[Rule]:
    rules = list(BACKBONE_RULES)
    if not config.type_vocab_size:
        rules = [r for r in rules if "token_type" not in r.hf]
    if config.embedding_size:
        rules += dense("embeddings_project", "embeddings_project")
    if config.pooler:
        rules += POOLER_RULES
    if config.num_labels:
        head = config.variant.head
        rules += CLASSIFIER_RULES if head == "pooler" else TWO_LAYER_CLASSIFIER_RULES
    return expand(rules, config.encoder.num_layers)


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    tensors = strip_prefix(tensors, FAMILIES[hf["model_type"]].prefix)
    config = config_from_hf(hf, has_pooler="pooler.dense.weight" in tensors)
    return load_model(config, rules_for(config), tensors, IGNORED)


def hf_config(c: BertConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    e, stem = c.encoder, FAMILIES[c.model_type].stem
    return {
        "model_type": c.model_type,
        "architectures": [f"{stem}ForSequenceClassification" if c.num_labels else f"{stem}Model"],
        **encoder_hf_fields(e, stem.upper()),
        "vocab_size": c.vocab_size,
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "max_position_embeddings": c.max_positions,
        "type_vocab_size": c.type_vocab_size,
        "pad_token_id": c.pad_token_id,
        "classifier_dropout": c.classifier_dropout,
        **({"embedding_size": c.embedding_size or e.width} if c.model_type == "electra" else {}),
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, BertConfig) or c.model_type not in FAMILIES:
        raise ConversionError(f"expected a BERT-named model, got {type(c).__name__}")
    prefix = FAMILIES[c.model_type].prefix if c.num_labels else ""
    write_hf(path, hf_config(c), to_hf_tensors(rules_for(c), model.params, prefix))
