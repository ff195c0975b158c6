"""HuggingFace DistilBERT (DistilBertModel, DistilBertForSequenceClassification) <-> ours.

DistilBERT is a BERT layer stack under other names, with no token types and no pooler; its
classifier is a dense layer, ReLU, dropout and a dense layer on the first token. One difference
is in training only: DistilBERT applies no dropout to an attention block's output before the
residual sum, where our layer (BERT's) does; inference is the same function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra_jax.convert.common import (
    ConversionError,
    Rule,
    attention,
    check_fields,
    dense,
    expand,
    field,
    label_fields,
    layer_norm,
    load_model,
    num_labels,
    require,
    require_full_heads,
    strip_prefix,
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import BertConfig, EncoderConfig, Model
from hydra_jax.models.encoder import ACTIVATIONS

MODEL_TYPE = "distilbert"
MODEL_TYPES = (MODEL_TYPE,)  # the HF `model_type`s this converter reads
HANDLED = (
    "vocab_size",
    "max_position_embeddings",
    "sinusoidal_pos_embds",
    "n_layers",
    "n_heads",
    "dim",
    "hidden_dim",
    "dropout",
    "attention_dropout",
    "activation",
    "qa_dropout",
    "seq_classif_dropout",
    "pad_token_id",
)
LAYER_NORM_EPS = 1e-12  # fixed in DistilBERT's modules, not a config field
# A buffer, and the masked-language-model head.
IGNORED = (r"embeddings\.position_ids", r"vocab_(transform|layer_norm|projector)\..*")

_LAYER = "transformer.layer.{l}"
_OURS = "encoder/layer_{l}"
BACKBONE_RULES = [
    Rule("embeddings.word_embeddings.weight", "word_embeddings/embedding"),
    Rule("embeddings.position_embeddings.weight", "position_embeddings/embedding"),
    *layer_norm("embeddings.LayerNorm", "embeddings_norm"),
    *attention(
        tuple(f"{_LAYER}.attention.{n}_lin" for n in ("q", "k", "v")),
        f"{_LAYER}.attention.out_lin",
        f"{_OURS}/attention",
    ),
    *layer_norm(f"{_LAYER}.sa_layer_norm", f"{_OURS}/attention_norm"),
    *dense(f"{_LAYER}.ffn.lin1", f"{_OURS}/mlp/fc1"),
    *dense(f"{_LAYER}.ffn.lin2", f"{_OURS}/mlp/fc2"),
    *layer_norm(f"{_LAYER}.output_layer_norm", f"{_OURS}/mlp_norm"),
]
CLASSIFIER_RULES = [*dense("pre_classifier", "pre_classifier"), *dense("classifier", "classifier")]


def config_from_hf(hf: dict[str, Any]) -> BertConfig:
    check_fields(hf, HANDLED, "DistilBERT")
    act = field(hf, "activation", str, "gelu")
    require(act in ACTIVATIONS, f"DistilBERT activation={act!r} unsupported")
    D, N = field(hf, "dim", int, 768), field(hf, "n_heads", int, 12)
    L, F = field(hf, "n_layers", int, 6), field(hf, "hidden_dim", int, 3072)
    require(min(D, N, L, F) > 0, f"DistilBERT sizes must be positive: D={D}, N={N}, L={L}, F={F}")
    require(D % N == 0, f"DistilBERT dim {D} is not divisible by n_heads {N}")
    encoder = EncoderConfig(
        num_heads=(N,) * L,
        width=D,
        head_dim=D // N,
        mlp_dim=F,
        activation=act,
        layer_norm_eps=LAYER_NORM_EPS,
        pre_norm=False,
        dropout=float(field(hf, "dropout", float, 0.1)),
        attention_dropout=float(field(hf, "attention_dropout", float, 0.1)),
    )
    return BertConfig(
        encoder=encoder,
        vocab_size=field(hf, "vocab_size", int),
        max_positions=field(hf, "max_position_embeddings", int, 512),
        type_vocab_size=0,
        pad_token_id=field(hf, "pad_token_id", int, 0),
        pooler=False,
        num_labels=num_labels(hf, "ForSequenceClassification"),
        classifier_dropout=float(field(hf, "seq_classif_dropout", float, 0.2)),
        model_type=MODEL_TYPE,
    )


def rules_for(config: BertConfig) -> list[Rule]:
    rules = BACKBONE_RULES + (CLASSIFIER_RULES if config.num_labels else [])
    return expand(rules, config.encoder.num_layers)


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    config = config_from_hf(hf)
    return load_model(config, rules_for(config), strip_prefix(tensors, "distilbert."), IGNORED)


def hf_config(c: BertConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    e = c.encoder
    require_full_heads(e, "DistilBERT")
    classifier = "DistilBertForSequenceClassification"
    return {
        "model_type": MODEL_TYPE,
        "architectures": [classifier if c.num_labels else "DistilBertModel"],
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_positions,
        "sinusoidal_pos_embds": False,
        "n_layers": e.num_layers,
        "n_heads": e.num_heads[0],
        "dim": e.width,
        "hidden_dim": e.mlp_dim,
        "dropout": e.dropout,
        "attention_dropout": e.attention_dropout,
        "activation": e.activation,
        "seq_classif_dropout": 0.2 if c.classifier_dropout is None else c.classifier_dropout,
        "pad_token_id": c.pad_token_id,
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, BertConfig) or c.model_type != MODEL_TYPE:
        raise ConversionError(f"expected a DistilBERT model, got {type(c).__name__}")
    require(
        c.encoder.layer_norm_eps == LAYER_NORM_EPS,
        f"HF DistilBERT's LayerNorm epsilon is {LAYER_NORM_EPS}, this model's is "
        f"{c.encoder.layer_norm_eps}",
    )
    prefix = "distilbert." if c.num_labels else ""
    write_hf(path, hf_config(c), to_hf_tensors(rules_for(c), model.params, prefix))
