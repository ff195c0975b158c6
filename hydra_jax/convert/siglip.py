"""HuggingFace SiglipModel <-> ours (both towers, the attention-pooling head, logit scale and
bias), and SiglipForImageClassification <-> ours (the vision tower, a classifier on its mean
token). The pooling head's `nn.MultiheadAttention` keeps its query, key and value in one
`in_proj` tensor `[3 D, D]` (query rows first), split into our three projections on load and
joined on export. Refused rather than guessed: a SiglipModel whose vision tower lacks its pooling
head (`vision_use_head: false`) and SigLIP 2 (`siglip2`: variable-resolution patches).

An image classifier reads neither the text tower nor the pooling head: its `text_config` is not
read, the pooling head's tensors are skipped on load, and the export writes
`vision_use_head: false` and the default `text_config`, which `transformers` loads to the same
logits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax.convert.clip import tower_rules
from hydra_jax.convert.common import (
    CONV,
    HEADS_BIAS,
    HEADS_IN,
    HEADS_OUT,
    SQUEEZE_1,
    SQUEEZE_2,
    TOWER_FIELDS,
    ConversionError,
    Rule,
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
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import (
    EncoderConfig,
    Model,
    SiglipClassifierConfig,
    SiglipConfig,
    SiglipTextConfig,
    SiglipVisionConfig,
)

MODEL_TYPE = "siglip"
MODEL_TYPES = (MODEL_TYPE,)  # the HF `model_type`s this converter reads
HANDLED = ("text_config", "vision_config", "initializer_factor")
_TOWER = (
    *TOWER_FIELDS,
    "model_type",
)
# Token ids only configure generation and the tokenizer; the text tower pools its last position.
TEXT_HANDLED = (
    *_TOWER,
    "vocab_size",
    "max_position_embeddings",
    "projection_size",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
VISION_HANDLED = (*_TOWER, "image_size", "patch_size", "num_channels", "vision_use_head")
IGNORED = (r"(text|vision)_model\.embeddings\.position_ids",)
_POOL = "vision_model.head"
CLASSIFIER = "SiglipForImageClassification"


def rules_for(config: SiglipConfig) -> list[Rule]:
    text = [
        Rule("text_model.embeddings.token_embedding.weight", "text/token_embedding/embedding"),
        Rule(
            "text_model.embeddings.position_embedding.weight", "text/position_embedding/embedding"
        ),
        *tower_rules("text_model", "text"),
        *layer_norm("text_model.final_layer_norm", "text/final_norm"),
        *dense("text_model.head", "text/projection"),
    ]
    vision = [
        *_vision_rules("vision"),
        Rule(f"{_POOL}.probe", "vision/pool/probe", SQUEEZE_2),
        *(
            Rule(f"{_POOL}.attention.w{n[0]}.weight", f"vision/pool/{n}/kernel", HEADS_IN)
            for n in ("query", "key", "value")
        ),
        *(
            Rule(f"{_POOL}.attention.w{n[0]}.bias", f"vision/pool/{n}/bias", HEADS_BIAS)
            for n in ("query", "key", "value")
        ),
        Rule(f"{_POOL}.attention.out_proj.weight", "vision/pool/out/kernel", HEADS_OUT),
        Rule(f"{_POOL}.attention.out_proj.bias", "vision/pool/out/bias"),
        *layer_norm(f"{_POOL}.layernorm", "vision/pool/norm"),
        *dense(f"{_POOL}.mlp.fc1", "vision/pool/mlp/fc1"),
        *dense(f"{_POOL}.mlp.fc2", "vision/pool/mlp/fc2"),
    ]
    return [
        *expand(text, config.text.encoder.num_layers),
        *expand(vision, config.vision.encoder.num_layers),
        Rule("logit_scale", "logit_scale", SQUEEZE_1),
        Rule("logit_bias", "logit_bias", SQUEEZE_1),
    ]


def _vision_rules(ours: str) -> list[Rule]:
    """The vision tower up to its final LayerNorm, our weights under `ours` ("" = the top)."""
    at = f"{ours}/" if ours else ""
    return [
        Rule("vision_model.embeddings.patch_embedding.weight", f"{at}patch/kernel", CONV),
        Rule("vision_model.embeddings.patch_embedding.bias", f"{at}patch/bias"),
        Rule(
            "vision_model.embeddings.position_embedding.weight",
            f"{at}position_embedding/embedding",
        ),
        *tower_rules("vision_model", ours),
        *layer_norm("vision_model.post_layernorm", f"{at}post_norm"),
    ]


def classifier_rules(config: SiglipClassifierConfig) -> list[Rule]:
    head = dense("classifier", "classifier") if config.num_labels else []
    return [*expand(_vision_rules(""), config.encoder.num_layers), *head]


def _encoder(hf: dict[str, Any], where: str) -> EncoderConfig:
    return encoder_config(
        hf,
        where,
        pre_norm=True,
        layer_norm_eps=1e-6,
        dropout_fields=("dropout", "attention_dropout"),
    )


def _vision_config(vision: dict[str, Any]) -> SiglipVisionConfig:
    check_fields(vision, VISION_HANDLED, "SigLIP vision_config")
    return SiglipVisionConfig(
        encoder=_encoder(vision, "SigLIP vision"),
        image_size=field(vision, "image_size", int, 224),
        patch_size=field(vision, "patch_size", int, 16),
        num_channels=field(vision, "num_channels", int, 3),
    )


def classifier_config_from_hf(hf: dict[str, Any]) -> SiglipClassifierConfig:
    check_fields(hf, HANDLED, "SigLIP")
    vision = _vision_config(field(hf, "vision_config", dict, {}))
    return SiglipClassifierConfig(vision, num_labels(hf, "ForImageClassification"))


def config_from_hf(hf: dict[str, Any]) -> SiglipConfig:
    check_fields(hf, HANDLED, "SigLIP")
    text, vision = field(hf, "text_config", dict, {}), field(hf, "vision_config", dict, {})
    check_fields(text, TEXT_HANDLED, "SigLIP text_config")
    require(
        field(vision, "vision_use_head", bool, True),
        "SigLIP vision_use_head=false (no attention-pooling head) is not modelled",
    )
    text_encoder = _encoder(text, "SigLIP text")
    vision_config = _vision_config(vision)
    vision_encoder = vision_config.encoder
    projection = field(text, "projection_size", int, text_encoder.width)
    require(
        projection == vision_encoder.width,
        f"SigLIP text projection_size {projection} differs from the image embedding's width "
        f"{vision_encoder.width}",
    )
    return SiglipConfig(
        text=SiglipTextConfig(
            encoder=text_encoder,
            vocab_size=field(text, "vocab_size", int),
            max_positions=field(text, "max_position_embeddings", int, 64),
            projection_dim=projection,
        ),
        vision=vision_config,
    )


def _split_in_proj(tensors: dict[str, Any]) -> dict[str, Any]:
    """The pooling head's `in_proj_weight` / `in_proj_bias` as `wq`, `wk`, `wv` tensors."""
    out = dict(tensors)
    for kind in ("weight", "bias"):
        name = f"{_POOL}.attention.in_proj_{kind}"
        if name not in out:
            continue
        value = np.asarray(out.pop(name))
        if value.shape[0] % 3:
            raise ConversionError(f"tensor {name!r} has {value.shape[0]} rows, not 3 D")
        for letter, part in zip("qkv", np.split(value, 3, axis=0), strict=True):
            out[f"{_POOL}.attention.w{letter}.{kind}"] = part
    return out


def is_classifier(hf: dict[str, Any]) -> bool:
    return CLASSIFIER in field(hf, "architectures", list, [])


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    if is_classifier(hf):
        config = classifier_config_from_hf(hf)
        unused = (*IGNORED, re.escape(_POOL) + r"\..*")  # the pooling head, unread
        return load_model(config, classifier_rules(config), tensors, unused)
    config = config_from_hf(hf)
    return load_model(config, rules_for(config), _split_in_proj(tensors), IGNORED)


def _vision_hf(vision: SiglipVisionConfig, use_head: bool) -> dict[str, Any]:
    return {
        **encoder_hf_fields(vision.encoder, "SigLIP vision"),
        "model_type": "siglip_vision_model",
        "attention_dropout": vision.encoder.attention_dropout,
        "image_size": vision.image_size,
        "patch_size": vision.patch_size,
        "num_channels": vision.num_channels,
        "vision_use_head": use_head,
    }


def hf_config(c: SiglipConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    text, vision = c.text, c.vision
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["SiglipModel"],
        "text_config": {
            **encoder_hf_fields(text.encoder, "SigLIP text"),
            "model_type": "siglip_text_model",
            "attention_dropout": text.encoder.attention_dropout,
            "vocab_size": text.vocab_size,
            "max_position_embeddings": text.max_positions,
            "projection_size": text.projection_dim,
        },
        "vision_config": _vision_hf(vision, use_head=True),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if isinstance(c, SiglipClassifierConfig):
        hf = {
            "model_type": MODEL_TYPE,
            "architectures": [CLASSIFIER],
            "text_config": {},
            "vision_config": _vision_hf(c.vision, use_head=False),
            **label_fields(c.num_labels),
        }
        write_hf(path, hf, to_hf_tensors(classifier_rules(c), model.params))
        return
    if not isinstance(c, SiglipConfig):
        raise ConversionError(f"expected a SigLIP model, got {type(c).__name__}")
    tensors = to_hf_tensors(rules_for(c), model.params)
    for kind in ("weight", "bias"):  # the pooling head's query, key and value in one tensor
        parts = [tensors.pop(f"{_POOL}.attention.w{x}.{kind}") for x in "qkv"]
        tensors[f"{_POOL}.attention.in_proj_{kind}"] = np.concatenate(parts, axis=0)
    write_hf(path, hf_config(c), tensors)
