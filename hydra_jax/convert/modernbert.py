"""HuggingFace ModernBERT (`ModernBertModel`, `ModernBertForSequenceClassification`; a
`ModernBertForMaskedLM` checkpoint loads as its backbone) <-> ours.

HF keeps a layer's query, key and value in one `Wqkv` tensor `[3 N K, D]` (query rows first);
we split it into our three projections on load and join them on export. Not modelled, so
refused: dropout inside the attention or MLP blocks (`attention_dropout`, `mlp_dropout`; every
released checkpoint has 0) and RoPE scaling (`rope_type` other than "default").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax.convert.common import (
    HEADS_BIAS,
    HEADS_IN,
    HEADS_OUT,
    LINEAR,
    ConversionError,
    Rule,
    check_fields,
    expand,
    field,
    label_fields,
    load_model,
    num_labels,
    require,
    require_full_heads,
    strip_prefix,
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import EncoderConfig, Model, ModernBertConfig
from hydra_jax.models.encoder import ACTIVATIONS
from hydra_jax.models.modernbert import POOLINGS

MODEL_TYPE = "modernbert"
MODEL_TYPES = (MODEL_TYPE,)  # the HF `model_type`s this converter reads
PREFIX = "model."
HANDLED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_activation",
    "max_position_embeddings",
    "norm_eps",
    "norm_bias",
    "pad_token_id",
    "attention_bias",
    "attention_dropout",
    "layer_types",
    "global_attn_every_n_layers",
    "rope_parameters",
    "global_rope_theta",
    "local_rope_theta",
    "local_attention",
    "embedding_dropout",
    "mlp_bias",
    "mlp_dropout",
    "classifier_pooling",
    "classifier_dropout",
    "classifier_bias",
    "classifier_activation",
    # No effect on the network's function: initialisation, special-token ids, the masked-LM
    # decoder, and kernels / compilation of the PyTorch implementation.
    "initializer_range",
    "initializer_cutoff_factor",
    "eos_token_id",
    "bos_token_id",
    "cls_token_id",
    "sep_token_id",
    "decoder_bias",
    "deterministic_flash_attn",
    "sparse_prediction",
    "sparse_pred_ignore_index",
    "reference_compile",
    "repad_logits_with_grad",
)
LAYER_TYPES = ("full_attention", "sliding_attention")
DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
THETA_FIELDS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}
# Buffers and the masked-LM decoder; a masked-LM checkpoint's `head` is its prediction head.
IGNORED = (r"decoder\..*", r".*rotary_emb\..*")
LM_HEAD = r"head\..*"
QKV = ("query", "key", "value")

_LAYER = "layers.{l}"
_OURS = "encoder/layer_{l}"
LAYER_RULES = [
    *(
        Rule(f"{_LAYER}.attn.W{n[0]}.weight", f"{_OURS}/attention/{n}/kernel", HEADS_IN)
        for n in QKV
    ),
    Rule(f"{_LAYER}.attn.Wo.weight", f"{_OURS}/attention/out/kernel", HEADS_OUT),
    Rule(f"{_LAYER}.mlp.Wi.weight", f"{_OURS}/mlp/fc1/kernel", LINEAR),
    Rule(f"{_LAYER}.mlp.Wo.weight", f"{_OURS}/mlp/fc2/kernel", LINEAR),
]


def _layer_types(hf: dict[str, Any], L: int) -> list[str]:
    types = field(hf, "layer_types", list, None)
    if types is None:
        every = field(hf, "global_attn_every_n_layers", int, 3)
        require(every > 0, f"ModernBERT global_attn_every_n_layers must be positive, got {every}")
        return ["sliding_attention" if l % every else "full_attention" for l in range(L)]
    named = len(types) == L and set(types) <= set(LAYER_TYPES)
    require(named, f"ModernBERT layer_types must name {L} layers from {LAYER_TYPES}: {types}")
    return [str(t) for t in types]


def _theta(hf: dict[str, Any], kind: str) -> float:
    rope = field(hf, "rope_parameters", dict, {}).get(kind) or {}
    kinds = rope.get("rope_type", "default")
    require(kinds == "default", f"ModernBERT {kind} rope_type={kinds!r}: only 'default'")
    theta = rope.get("rope_theta", field(hf, THETA_FIELDS[kind], float, DEFAULT_THETA[kind]))
    require(
        isinstance(theta, int | float) and theta > 1,
        f"ModernBERT {kind} rope_theta must be a number above 1, got {theta!r}",
    )
    return float(theta)


def config_from_hf(hf: dict[str, Any]) -> ModernBertConfig:
    check_fields(hf, HANDLED, "ModernBERT")
    for name in ("attention_dropout", "mlp_dropout"):
        rate = field(hf, name, float, 0.0)
        require(rate == 0, f"ModernBERT {name}={rate}: dropout there is not modelled (only 0)")
    act = field(hf, "hidden_activation", str, "gelu")
    head_act = field(hf, "classifier_activation", str, "gelu")
    for name, value in (("hidden_activation", act), ("classifier_activation", head_act)):
        require(value in ACTIVATIONS, f"ModernBERT {name}={value!r} unsupported")
    D, N = field(hf, "hidden_size", int, 768), field(hf, "num_attention_heads", int, 12)
    L, F = field(hf, "num_hidden_layers", int, 22), field(hf, "intermediate_size", int, 1152)
    require(min(D, N, L, F) > 0, f"ModernBERT sizes must be positive: D={D}, N={N}, L={L}, F={F}")
    require(
        D % N == 0 and (D // N) % 2 == 0,
        f"ModernBERT hidden_size {D} must split into {N} heads of an even width",
    )
    types = _layer_types(hf, L)
    window = field(hf, "local_attention", int, 128) // 2
    require(window > 0, f"ModernBERT local_attention must be at least 2, got {2 * window}")
    attention_bias = field(hf, "attention_bias", bool, False)
    encoder = EncoderConfig(
        num_heads=(N,) * L,
        width=D,
        head_dim=D // N,
        mlp_dim=F,
        activation=act,
        layer_norm_eps=float(field(hf, "norm_eps", float, 1e-5)),
        pre_norm=True,
        qkv_bias=attention_bias,
        out_bias=attention_bias,
        mlp_bias=field(hf, "mlp_bias", bool, False),
        norm_bias=field(hf, "norm_bias", bool, False),
        gated_mlp=True,
        rotary=tuple(_theta(hf, t) for t in types),
        windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        first_norm=False,
    )
    pooling = field(hf, "classifier_pooling", str, "cls")
    require(pooling in POOLINGS, f"ModernBERT classifier_pooling={pooling!r}: one of {POOLINGS}")
    return ModernBertConfig(
        encoder=encoder,
        vocab_size=field(hf, "vocab_size", int),
        max_positions=field(hf, "max_position_embeddings", int, 8192),
        pad_token_id=field(hf, "pad_token_id", int, 0),
        num_labels=num_labels(hf, "ForSequenceClassification"),
        pooling=pooling,
        head_bias=field(hf, "classifier_bias", bool, False),
        head_activation=head_act,
        classifier_dropout=float(field(hf, "classifier_dropout", float, 0.0)),
        embedding_dropout=float(field(hf, "embedding_dropout", float, 0.0)),
    )


def _norm(hf: str, ours: str, bias: bool) -> list[Rule]:
    rules = [Rule(f"{hf}.weight", f"{ours}/scale")]
    return [*rules, Rule(f"{hf}.bias", f"{ours}/bias")] if bias else rules


def _backbone_rules(c: ModernBertConfig) -> list[Rule]:
    e = c.encoder
    rules = [
        Rule("embeddings.tok_embeddings.weight", "word_embeddings/embedding"),
        *_norm("embeddings.norm", "embeddings_norm", e.norm_bias),
        *_norm("final_norm", "final_norm", e.norm_bias),
    ]
    layers = list(LAYER_RULES)
    if e.qkv_bias:
        layers += [
            Rule(f"{_LAYER}.attn.W{n[0]}.bias", f"{_OURS}/attention/{n}/bias", HEADS_BIAS)
            for n in QKV
        ]
    if e.out_bias:
        layers.append(Rule(f"{_LAYER}.attn.Wo.bias", f"{_OURS}/attention/out/bias"))
    if e.mlp_bias:
        layers += [
            Rule(f"{_LAYER}.mlp.W{n}.bias", f"{_OURS}/mlp/fc{k}/bias")
            for n, k in (("i", 1), ("o", 2))
        ]
    layers += _norm(f"{_LAYER}.mlp_norm", f"{_OURS}/mlp_norm", e.norm_bias)
    rules += expand(layers, e.num_layers)
    for l in range(1, e.num_layers):  # layer 0 has no attention norm
        rules += _norm(f"layers.{l}.attn_norm", f"encoder/layer_{l}/attention_norm", e.norm_bias)
    return rules


def _head_rules(c: ModernBertConfig) -> list[Rule]:
    dense = [Rule("head.dense.weight", "pre_classifier/kernel", LINEAR)]
    if c.head_bias:
        dense.append(Rule("head.dense.bias", "pre_classifier/bias"))
    return [
        *dense,
        *_norm("head.norm", "head_norm", c.encoder.norm_bias),
        Rule("classifier.weight", "classifier/kernel", LINEAR),
        Rule("classifier.bias", "classifier/bias"),
    ]


def _split_qkv(tensors: dict[str, Any]) -> dict[str, Any]:
    """HF's fused `Wqkv` tensors as separate `Wq`, `Wk`, `Wv` (query rows first)."""
    out = {}
    for name, value in tensors.items():
        if ".attn.Wqkv." not in name:
            out[name] = value
            continue
        if np.shape(value)[0] % 3:
            raise ConversionError(f"tensor {name!r} has {np.shape(value)[0]} rows, not 3 N K")
        parts = np.split(np.asarray(value), 3, axis=0)
        for letter, part in zip("qkv", parts, strict=True):
            out[name.replace(".Wqkv.", f".W{letter}.")] = part
    return out


def _join_qkv(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {k: v for k, v in tensors.items() if not any(f".attn.W{x}." in k for x in "qkv")}
    for name in tensors:
        if ".attn.Wq." in name:
            parts = [tensors[name.replace(".Wq.", f".W{x}.")] for x in "qkv"]
            out[name.replace(".Wq.", ".Wqkv.")] = np.concatenate(parts, axis=0)
    return out


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    config = config_from_hf(hf)
    rules = _backbone_rules(config) + (_head_rules(config) if config.num_labels else [])
    ignored = IGNORED if config.num_labels else (*IGNORED, LM_HEAD)
    tensors = _split_qkv(strip_prefix(tensors, PREFIX))
    return load_model(config, rules, tensors, ignored)


def hf_config(c: ModernBertConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    e = c.encoder
    require_full_heads(e, "ModernBERT")
    types = ["sliding_attention" if w else "full_attention" for w in e.windows]
    theta = {t: th for t, th in zip(types, e.rotary, strict=True)}
    windows = {w for w in e.windows if w}
    classifier = "ModernBertForSequenceClassification"
    return {
        "model_type": MODEL_TYPE,
        "architectures": [classifier if c.num_labels else "ModernBertModel"],
        "vocab_size": c.vocab_size,
        "hidden_size": e.width,
        "intermediate_size": e.mlp_dim,
        "num_hidden_layers": e.num_layers,
        "num_attention_heads": e.num_heads[0],
        "hidden_activation": e.activation,
        "max_position_embeddings": c.max_positions,
        "norm_eps": e.layer_norm_eps,
        "norm_bias": e.norm_bias,
        "pad_token_id": c.pad_token_id,
        "attention_bias": e.qkv_bias,
        "attention_dropout": 0.0,
        "mlp_bias": e.mlp_bias,
        "mlp_dropout": 0.0,
        "layer_types": types,
        "rope_parameters": {
            t: {"rope_type": "default", "rope_theta": th} for t, th in theta.items()
        },
        "local_attention": 2 * (windows.pop() if windows else 64),
        "embedding_dropout": c.embedding_dropout,
        "classifier_pooling": c.pooling,
        "classifier_dropout": c.classifier_dropout,
        "classifier_bias": c.head_bias,
        "classifier_activation": c.head_activation,
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, ModernBertConfig):
        raise ConversionError(f"expected a ModernBERT model, got {type(c).__name__}")
    e = c.encoder
    require(
        not e.first_norm
        and e.gated_mlp
        and e.qkv_bias == e.out_bias
        and e.rotary
        and e.windows
        and len({w for w in e.windows if w}) <= 1
        and len({th for th, w in zip(e.rotary, e.windows, strict=True) if w}) <= 1
        and len({th for th, w in zip(e.rotary, e.windows, strict=True) if not w}) <= 1,
        "this ModernBERT's stack has settings HF's config cannot express",
    )
    prefix = PREFIX if c.num_labels else ""
    tensors = to_hf_tensors(_backbone_rules(c), model.params, prefix)
    if c.num_labels:
        tensors.update(to_hf_tensors(_head_rules(c), model.params))
    write_hf(path, hf_config(c), _join_qkv(tensors))
