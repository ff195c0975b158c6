"""HuggingFace ViT (ViTModel, ViTForImageClassification) and DeiT (DeiTModel,
DeiTForImageClassification, DeiTForImageClassificationWithTeacher) <-> ours: one network, DeiT
with a distillation token (and, with its teacher's head, a second classifier)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra_jax.convert.common import (
    CONV,
    ENCODER_FIELDS,
    SQUEEZE_1,
    SQUEEZE_2,
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
from hydra_jax.models import Model, ViTConfig
from hydra_jax.models.encoder import ACTIVATIONS

HANDLED = (
    *ENCODER_FIELDS,
    "intermediate_size",
    "image_size",
    "patch_size",
    "num_channels",
    "qkv_bias",
    "encoder_stride",
    "pooler_output_size",
    "pooler_act",
)
# `encoder_stride` only configures ViTForMaskedImageModeling's decoder, which we do not model.

IGNORED = ()
# HF model_type -> (class-name stem, the backbone's prefix in a classifier checkpoint).
FAMILIES = {"vit": ("ViT", "vit."), "deit": ("DeiT", "deit.")}
MODEL_TYPES = tuple(FAMILIES)  # the HF `model_type`s this converter reads

_LAYER = "encoder.layer.{l}"
_OURS = "encoder/layer_{l}"


def rules_for(config: ViTConfig) -> list[Rule]:
    qkv_bias = config.encoder.qkv_bias
    rules = [
        Rule("embeddings.cls_token", "cls_token", SQUEEZE_2),
        *(
            [Rule("embeddings.distillation_token", "distillation_token", SQUEEZE_2)]
            if config.distillation_token
            else []
        ),
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
    if config.distilled_head:  # DeiT with its teacher's head
        rules += dense("cls_classifier", "classifier")
        rules += dense("distillation_classifier", "distillation_classifier")
    elif config.num_labels:
        rules += dense("classifier", "classifier")
    return expand(rules, config.encoder.num_layers)


def config_from_hf(hf: dict[str, Any], has_pooler: bool, distilled_head: bool = False) -> ViTConfig:
    model_type = field(hf, "model_type", str, "vit")  # (a dual encoder's vision config omits it)
    require(
        model_type in FAMILIES,
        f"ViT-named model_type {model_type!r} is not one of {sorted(FAMILIES)}",
    )
    check_fields(hf, HANDLED, FAMILIES[model_type][0])
    D = field(hf, "hidden_size", int)
    pooler_size = field(hf, "pooler_output_size", int, D)
    require(
        pooler_size == D, f"ViT pooler_output_size {pooler_size} != hidden_size {D}: unsupported"
    )
    pooler_act = field(hf, "pooler_act", str, "tanh")
    require(pooler_act in ACTIVATIONS, f"ViT pooler_act={pooler_act!r} unsupported")
    encoder = encoder_config(hf, "ViT", pre_norm=True, qkv_bias=field(hf, "qkv_bias", bool, True))
    return ViTConfig(
        encoder=encoder,
        image_size=field(hf, "image_size", int, 224),
        patch_size=field(hf, "patch_size", int, 16),
        num_channels=field(hf, "num_channels", int, 3),
        pooler=has_pooler,
        pooler_activation=pooler_act,
        num_labels=num_labels(hf, "ForImageClassification")
        or num_labels(hf, "ForImageClassificationWithTeacher"),
        model_type=model_type,
        distillation_token=model_type == "deit",
        distilled_head=distilled_head,
    )


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    tensors = strip_prefix(tensors, FAMILIES[hf["model_type"]][1])
    config = config_from_hf(
        hf,
        has_pooler="pooler.dense.weight" in tensors,
        distilled_head="cls_classifier.weight" in tensors,
    )
    return load_model(config, rules_for(config), tensors, IGNORED)


def hf_config(c: ViTConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    require(
        c.projection_dim == 0,
        "a ViT vision tower's projection belongs to its dual encoder; export the dual encoder",
    )
    e, stem = c.encoder, FAMILIES[c.model_type][0]
    classifier = f"{stem}ForImageClassification" + ("WithTeacher" if c.distilled_head else "")
    return {
        "model_type": c.model_type,
        "architectures": [classifier if c.num_labels else f"{stem}Model"],
        **encoder_hf_fields(e, stem),
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.num_channels,
        "qkv_bias": e.qkv_bias,
        "pooler_act": c.pooler_activation,
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, ViTConfig):
        raise ConversionError(f"expected a ViT model, got {type(c).__name__}")
    hf = hf_config(c)
    prefix = FAMILIES[c.model_type][1] if c.num_labels else ""
    write_hf(path, hf, to_hf_tensors(rules_for(c), model.params, prefix))
