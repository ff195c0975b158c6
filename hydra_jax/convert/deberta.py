"""HuggingFace DeBERTa-v2 and DeBERTa-v3 (`DebertaV2Model`, `DebertaV2ForSequenceClassification`;
`model_type` "deberta-v2" for both) <-> ours.

DeBERTa is a post-LN BERT layer stack whose attention also reads learned embeddings of the
distance between query and key (`EncoderConfig.relative`), with its own embedding stage and a
two-layer head (`ContextPooler`: dropout, dense, GELU; then dropout and the classifier). What
we refuse rather than guess: DeBERTa-v2's convolution layer (`conv_kernel_size`, the xlarge /
xxlarge checkpoints), `p2p` attention (DeBERTa v1), absolute-only attention
(`relative_attention: false`) and pooler activations other than GELU.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra_jax.convert.common import (
    ENCODER_FIELDS,
    HEADS_BIAS,
    HEADS_IN,
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
from hydra_jax.models import BertConfig, Model, RelativeAttention

MODEL_TYPE = "deberta-v2"
MODEL_TYPES = (MODEL_TYPE,)  # the HF `model_type`s this converter reads
STEM = "DebertaV2"
PREFIX = "deberta."
HANDLED = (
    *ENCODER_FIELDS,
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "pad_token_id",
    "relative_attention",
    "max_relative_positions",
    "position_buckets",
    "pos_att_type",
    "norm_rel_ebd",
    "share_att_key",
    "position_biased_input",
    "embedding_size",
    "pooler_hidden_size",
    "pooler_dropout",
    "pooler_hidden_act",
    "cls_dropout",
    "conv_kernel_size",
    "conv_groups",
    "conv_act",
    "legacy",
    "initializer_range",
)
# Buffers and pre-training heads (masked LM, replaced-token detection). `transformers` itself
# ignores a position table that a checkpoint without absolute positions carries.
IGNORED = (
    r"embeddings\.position_ids",
    r"lm_predictions\..*",
    r"mask_predictions\..*",
    r"cls\..*",
    r"lm_head\..*",
)
UNUSED_POSITIONS = r"embeddings\.position_embeddings\.weight"

_LAYER = "encoder.layer.{l}"
_OURS = "encoder/layer_{l}"
LAYER_RULES = [
    *attention(
        tuple(f"{_LAYER}.attention.self.{n}_proj" for n in ("query", "key", "value")),
        f"{_LAYER}.attention.output.dense",
        f"{_OURS}/attention",
    ),
    *layer_norm(f"{_LAYER}.attention.output.LayerNorm", f"{_OURS}/attention_norm"),
    *dense(f"{_LAYER}.intermediate.dense", f"{_OURS}/mlp/fc1"),
    *dense(f"{_LAYER}.output.dense", f"{_OURS}/mlp/fc2"),
    *layer_norm(f"{_LAYER}.output.LayerNorm", f"{_OURS}/mlp_norm"),
]
HEAD_RULES = [*dense("pooler.dense", "pre_classifier"), *dense("classifier", "classifier")]


def _position_terms(hf: dict[str, Any]) -> tuple[bool, bool]:
    kinds = field(hf, "pos_att_type", (list, str), [])
    if isinstance(kinds, str):
        kinds = kinds.lower().split("|")
    kinds = {str(k).strip() for k in kinds} - {""}
    require(
        kinds <= {"c2p", "p2c"},
        f"DeBERTa pos_att_type {sorted(kinds)}: only 'c2p' and 'p2c' are modelled",
    )
    return "c2p" in kinds, "p2c" in kinds


def relative_from_hf(hf: dict[str, Any]) -> RelativeAttention:
    require(
        field(hf, "relative_attention", bool, False),
        "DeBERTa relative_attention=false is not modelled (every released DeBERTa-v2/v3 "
        "checkpoint sets it)",
    )
    positions = field(hf, "max_position_embeddings", int, 512)
    max_distance = field(hf, "max_relative_positions", int, -1)
    max_distance = positions if max_distance < 1 else max_distance
    buckets = max(field(hf, "position_buckets", int, -1), 0)
    require(buckets == 0 or buckets >= 4, f"DeBERTa position_buckets={buckets}: at least 4")
    require(
        buckets == 0 or max_distance > buckets // 2 + 1,
        f"DeBERTa max_relative_positions={max_distance} leaves no log buckets beyond "
        f"position_buckets // 2 = {buckets // 2}",
    )
    norms = {n.strip() for n in field(hf, "norm_rel_ebd", str, "none").lower().split("|")}
    require(
        norms <= {"none", "layer_norm"},
        f"DeBERTa norm_rel_ebd {sorted(norms)}: only 'layer_norm' or 'none'",
    )
    c2p, p2c = _position_terms(hf)
    return RelativeAttention(
        span=buckets or max_distance,
        buckets=buckets,
        max_distance=max_distance,
        c2p=c2p,
        p2c=p2c,
        share_keys=field(hf, "share_att_key", bool, False),
        norm="layer_norm" in norms,
    )


def config_from_hf(hf: dict[str, Any]) -> BertConfig:
    check_fields(hf, HANDLED, "DeBERTa")
    require(
        field(hf, "conv_kernel_size", int, 0) <= 0,
        "DeBERTa conv_kernel_size > 0 (the convolution of DeBERTa-v2 xlarge/xxlarge) is not "
        "modelled",
    )
    act = field(hf, "pooler_hidden_act", str, "gelu")
    require(act == "gelu", f"DeBERTa pooler_hidden_act={act!r}: only 'gelu'")
    encoder = encoder_config(
        hf, "DeBERTa", pre_norm=False, layer_norm_eps=1e-7, dropout_default=0.1
    )
    D = encoder.width
    pooler = field(hf, "pooler_hidden_size", int, D)
    require(pooler == D, f"DeBERTa pooler_hidden_size={pooler} differs from hidden_size {D}")
    embedding_size = field(hf, "embedding_size", int, D)
    require(embedding_size > 0, f"DeBERTa embedding_size must be positive, got {embedding_size}")
    relative = relative_from_hf(hf)
    cls_dropout = field(hf, "cls_dropout", float, None)
    return BertConfig(
        encoder=dataclasses.replace(encoder, relative=relative),
        vocab_size=field(hf, "vocab_size", int),
        max_positions=field(hf, "max_position_embeddings", int, 512),
        type_vocab_size=field(hf, "type_vocab_size", int, 0),
        pad_token_id=field(hf, "pad_token_id", int, 0),
        pooler=False,
        num_labels=num_labels(hf, "ForSequenceClassification"),
        classifier_dropout=None if cls_dropout is None else float(cls_dropout),
        model_type=MODEL_TYPE,
        embedding_size=0 if embedding_size == D else embedding_size,
        absolute_positions=field(hf, "position_biased_input", bool, True),
        pre_classifier_dropout=float(field(hf, "pooler_dropout", float, 0.0)),
    )


def _backbone_rules(c: BertConfig) -> list[Rule]:
    r = c.encoder.relative
    rules = [Rule("embeddings.word_embeddings.weight", "word_embeddings/embedding")]
    if c.absolute_positions:
        rules.append(Rule("embeddings.position_embeddings.weight", "position_embeddings/embedding"))
    if c.type_vocab_size:
        rules.append(
            Rule("embeddings.token_type_embeddings.weight", "token_type_embeddings/embedding")
        )
    if c.embedding_size:
        rules += dense("embeddings.embed_proj", "embeddings_project", bias=False)
    rules += layer_norm("embeddings.LayerNorm", "embeddings_norm")
    rules.append(Rule("encoder.rel_embeddings.weight", "encoder/rel_embeddings"))
    if r.norm:
        rules += layer_norm("encoder.LayerNorm", "encoder/rel_norm")
    rules += LAYER_RULES
    separate = [] if r.share_keys else [("key", r.c2p), ("query", r.p2c)]
    for name in (name for name, used in separate if used):
        hf, ours = f"{_LAYER}.attention.self.pos_{name}_proj", f"{_OURS}/attention/pos_{name}"
        rules += [
            Rule(f"{hf}.weight", f"{ours}/kernel", HEADS_IN),
            Rule(f"{hf}.bias", f"{ours}/bias", HEADS_BIAS),
        ]
    return expand(rules, c.encoder.num_layers)


def rules_for(c: BertConfig) -> list[Rule]:
    return _backbone_rules(c) + (HEAD_RULES if c.num_labels else [])


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    config = config_from_hf(hf)
    ignored = IGNORED if config.absolute_positions else (*IGNORED, UNUSED_POSITIONS)
    return load_model(config, rules_for(config), strip_prefix(tensors, PREFIX), ignored)


def hf_config(c: BertConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    e, r = c.encoder, c.encoder.relative
    return {
        "model_type": MODEL_TYPE,
        "architectures": [f"{STEM}ForSequenceClassification" if c.num_labels else f"{STEM}Model"],
        **encoder_hf_fields(e, "DeBERTa"),
        "vocab_size": c.vocab_size,
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "max_position_embeddings": c.max_positions,
        "type_vocab_size": c.type_vocab_size,
        "pad_token_id": c.pad_token_id,
        "embedding_size": c.embedding_size or e.width,
        "position_biased_input": c.absolute_positions,
        "relative_attention": True,
        "max_relative_positions": r.max_distance,
        "position_buckets": r.buckets or -1,
        "pos_att_type": [k for k, used in (("p2c", r.p2c), ("c2p", r.c2p)) if used],
        "norm_rel_ebd": "layer_norm" if r.norm else "none",
        "share_att_key": r.share_keys,
        "pooler_hidden_size": e.width,
        "pooler_hidden_act": "gelu",
        "pooler_dropout": c.pre_classifier_dropout or 0.0,
        "cls_dropout": c.classifier_dropout,
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, BertConfig) or c.model_type != MODEL_TYPE:
        raise ConversionError(f"expected a DeBERTa model, got {type(c).__name__}")
    prefix = PREFIX if c.num_labels else ""
    tensors = to_hf_tensors(_backbone_rules(c), model.params, prefix)
    if c.num_labels:
        tensors.update(to_hf_tensors(HEAD_RULES, model.params))
    write_hf(path, hf_config(c), tensors)
