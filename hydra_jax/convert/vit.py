"""HuggingFace ViT (ViTModel, ViTForImageClassification) <-> ours."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from hydra_jax.convert.common import (
    CONV,
    SQUEEZE_1,
    SQUEEZE_2,
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
from hydra_jax.models import EncoderConfig, Model, ViTConfig
from hydra_jax.models.encoder import ACTIVATIONS

HANDLED = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps", "image_size",
    "patch_size", "num_channels", "qkv_bias", "encoder_stride", "pooler_output_size",
    "pooler_act",
)  # fmt: skip
# `encoder_stride` only configures ViTForMaskedImageModeling's decoder, which we do not model.

IGNORED = ()

_LAYER = "encoder.layer.{l}"
_OURS = "encoder/layer_{l}"


def rules_for(config: ViTConfig) -> list[Rule]:
    qkv_bias = config.encoder.qkv_bias
    rules = [
        Rule("embeddings.cls_token", "cls_token", SQUEEZE_2),
        Rule("embeddings.position_embeddings", "position_embeddings", SQUEEZE_1),
        Rule("embeddings.patch_embeddings.projection.weight", "patch/kernel", CONV),
        Rule("embeddings.patch_embeddings.projection.bias", "patch/bias"),
        *layer_norm(f"{_LAYER}.layernorm_before", f"{_OURS}/attention_norm"),
        *attention(
            tuple(f"{_LAYER}.attention.attention.{n}" for n in ("query", "key", "value")),
            f"{_LAYER}.attention.output.dense",
            f"{_OURS}/attention",
            qkv_bias=qkv_bias,
        ),
        *layer_norm(f"{_LAYER}.layernorm_after", f"{_OURS}/mlp_norm"),
        *dense(f"{_LAYER}.intermediate.dense", f"{_OURS}/mlp/fc1"),
        *dense(f"{_LAYER}.output.dense", f"{_OURS}/mlp/fc2"),
        *layer_norm("layernorm", "final_norm"),
    ]
    if config.pooler:
        rules += dense("pooler.dense", "pooler")
    if config.num_labels:
        rules += dense("classifier", "classifier")
    return expand(rules, config.encoder.num_layers)


def config_from_hf(hf: dict[str, Any], has_pooler: bool) -> ViTConfig:
    check_fields(hf, HANDLED, "ViT")
    require(hf["hidden_act"] in ACTIVATIONS, f"ViT hidden_act={hf['hidden_act']!r} unsupported")
    D, N = hf["hidden_size"], hf["num_attention_heads"]
    require(D % N == 0, f"ViT hidden_size {D} is not divisible by num_attention_heads {N}")
    require(
        hf.get("pooler_output_size", D) == D,
        f"ViT pooler_output_size {hf.get('pooler_output_size')} != hidden_size {D}: unsupported",
    )
    pooler_act = hf.get("pooler_act", "tanh")
    require(pooler_act in ACTIVATIONS, f"ViT pooler_act={pooler_act!r} unsupported")
    is_classifier = any(a.endswith("ForImageClassification") for a in hf.get("architectures", []))
    encoder = EncoderConfig(
        num_heads=(N,) * hf["num_hidden_layers"],
        width=D,
        head_dim=D // N,
        mlp_dim=hf["intermediate_size"],
        activation=hf["hidden_act"],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        pre_norm=True,
        qkv_bias=hf.get("qkv_bias", True),
        dropout=hf.get("hidden_dropout_prob", 0.0),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.0),
    )
    return ViTConfig(
        encoder=encoder,
        image_size=hf.get("image_size", 224),
        patch_size=hf.get("patch_size", 16),
        num_channels=hf.get("num_channels", 3),
        pooler=has_pooler,
        pooler_activation=pooler_act,
        num_labels=len(hf.get("id2label", {0: 0, 1: 1})) if is_classifier else 0,
    )


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    tensors = strip_prefix(tensors, "vit.")
    config = config_from_hf(hf, has_pooler="pooler.dense.weight" in tensors)
    target = jax.eval_shape(lambda: Model.init(config, jax.random.key(0)).params)
    return Model(config, fill(rules_for(config), tensors, target, IGNORED))


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, ViTConfig):
        raise ConversionError(f"expected a ViT model, got {type(c).__name__}")
    e = c.encoder
    require(
        len(set(e.num_heads)) == 1 and e.num_heads[0] * e.head_dim == e.width,
        f"HF ViT needs the same N heads in every layer with N*K == D; this model has "
        f"{list(e.num_heads)} heads of dim {e.head_dim} at width {e.width}",
    )
    hf = {
        "model_type": "vit",
        "architectures": ["ViTForImageClassification" if c.num_labels else "ViTModel"],
        "hidden_size": e.width,
        "num_hidden_layers": e.num_layers,
        "num_attention_heads": e.num_heads[0],
        "intermediate_size": e.mlp_dim,
        "hidden_act": e.activation,
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "layer_norm_eps": e.layer_norm_eps,
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.num_channels,
        "qkv_bias": e.qkv_bias,
        "pooler_act": c.pooler_activation,
    }
    if c.num_labels:
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(c.num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(c.num_labels)}
    prefix = "vit." if c.num_labels else ""
    write_hf(path, hf, to_hf_tensors(rules_for(c), model.params, prefix))
