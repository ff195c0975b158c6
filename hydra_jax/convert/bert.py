"""HuggingFace BERT (BertModel, BertForSequenceClassification) <-> ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from hydra_jax.convert.common import (
    ConversionError,
    Rule,
    attention,
    check_fields,
    dense,
    expand,
    fill,
    layer_norm,
    require,
    strip_prefix,
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import BertConfig, EncoderConfig, Model
from hydra_jax.models.encoder import ACTIVATIONS

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
    require(
        hf.get("position_embedding_type", "absolute") == "absolute",
        f"BERT position_embedding_type={hf.get('position_embedding_type')!r}: only 'absolute'",
    )
    require(hf["hidden_act"] in ACTIVATIONS, f"BERT hidden_act={hf['hidden_act']!r} unsupported")
    D, N = hf["hidden_size"], hf["num_attention_heads"]
    require(D % N == 0, f"BERT hidden_size {D} is not divisible by num_attention_heads {N}")
    is_classifier = any(
        a.endswith("ForSequenceClassification") for a in hf.get("architectures", [])
    )
    encoder = EncoderConfig(
        num_heads=(N,) * hf["num_hidden_layers"],
        width=D,
        head_dim=D // N,
        mlp_dim=hf["intermediate_size"],
        activation=hf["hidden_act"],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        pre_norm=False,
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
    )
    return BertConfig(
        encoder=encoder,
        vocab_size=hf["vocab_size"],
        max_positions=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        pad_token_id=hf.get("pad_token_id", 0) or 0,
        pooler=has_pooler,
        num_labels=len(hf.get("id2label", {0: 0, 1: 1})) if is_classifier else 0,
        classifier_dropout=hf.get("classifier_dropout"),
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
    target = jax.eval_shape(lambda: Model.init(config, jax.random.key(0)).params)
    return Model(config, fill(rules_for(config), tensors, target, IGNORED))


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, BertConfig):
        raise ConversionError(f"expected a BERT model, got {type(c).__name__}")
    e = c.encoder
    require(
        len(set(e.num_heads)) == 1 and e.num_heads[0] * e.head_dim == e.width,
        f"HF BERT needs the same N heads in every layer with N*K == D; this model has "
        f"{list(e.num_heads)} heads of dim {e.head_dim} at width {e.width}",
    )
    hf = {
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification" if c.num_labels else "BertModel"],
        "vocab_size": c.vocab_size,
        "hidden_size": e.width,
        "num_hidden_layers": e.num_layers,
        "num_attention_heads": e.num_heads[0],
        "intermediate_size": e.mlp_dim,
        "hidden_act": e.activation,
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "max_position_embeddings": c.max_positions,
        "type_vocab_size": c.type_vocab_size,
        "layer_norm_eps": e.layer_norm_eps,
        "pad_token_id": c.pad_token_id,
        "classifier_dropout": c.classifier_dropout,
    }
    if c.num_labels:
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(c.num_labels)}
    prefix = "bert." if c.num_labels else ""
    write_hf(path, hf, to_hf_tensors(rules_for(c), model.params, prefix))
