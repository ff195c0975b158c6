"""HuggingFace CLIPModel <-> ours (both towers, projections, logit scale), and
CLIPForImageClassification <-> ours (the vision tower, a classifier on its mean patch token).

An image classifier reads neither the text tower nor the final LayerNorm of the vision tower: its
`text_config` is not read and the LayerNorm's tensors are skipped on load; the export writes the
default `text_config` and an identity LayerNorm (ones, zeros), which `transformers` loads to the
same logits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax.convert.common import (
    CONV,
    TOWER_FIELDS,
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
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import (
    CLIPClassifierConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    EncoderConfig,
    Model,
)

HANDLED = (
    "projection_dim",
    "logit_scale_init_value",
    "text_config",
    "vision_config",
    "text_config_dict",
    "vision_config_dict",
)
_TOWER = (
    *TOWER_FIELDS,
    "dropout",
    # The tower's own projection_dim only configures CLIP{Text,Vision}ModelWithProjection;
    # CLIPModel uses the top-level one.
    "projection_dim",
)
TEXT_HANDLED = (*_TOWER, "vocab_size", "max_position_embeddings", "eos_token_id")
VISION_HANDLED = (*_TOWER, "image_size", "patch_size", "num_channels")

IGNORED = (r"(text|vision)_model\.embeddings\.position_ids",)
MODEL_TYPE = "clip"
MODEL_TYPES = (MODEL_TYPE,)  # the HF `model_type`s this converter reads
CLASSIFIER = "CLIPForImageClassification"
_POST_NORM = "vision_model.post_layernorm"


def tower_rules(hf: str, ours: str) -> list[Rule]:
    """One tower's layers: HF's under `hf`, ours under `ours` ("" = the top)."""
    layer, mine = f"{hf}.encoder.layers.{{l}}", f"{ours}/encoder/layer_{{l}}".lstrip("/")
    return [
        *layer_norm(f"{layer}.layer_norm1", f"{mine}/attention_norm"),
        *attention(
            tuple(f"{layer}.self_attn.{n}_proj" for n in "qkv"),
            f"{layer}.self_attn.out_proj",
            f"{mine}/attention",
        ),
        *layer_norm(f"{layer}.layer_norm2", f"{mine}/mlp_norm"),
        *dense(f"{layer}.mlp.fc1", f"{mine}/mlp/fc1"),
        *dense(f"{layer}.mlp.fc2", f"{mine}/mlp/fc2"),
    ]


def rules_for(config: CLIPConfig) -> list[Rule]:
    text = [
        Rule("text_model.embeddings.token_embedding.weight", "text/token_embedding/embedding"),
        Rule(
            "text_model.embeddings.position_embedding.weight", "text/position_embedding/embedding"
        ),
        *tower_rules("text_model", "text"),
        *layer_norm("text_model.final_layer_norm", "text/final_norm"),
        *dense("text_projection", "text/projection", bias=False),
    ]
    vision = [
        *_vision_rules("vision"),
        *layer_norm(_POST_NORM, "vision/post_norm"),
        *dense("visual_projection", "vision/projection", bias=False),
    ]
    return [
        *expand(text, config.text.encoder.num_layers),
        *expand(vision, config.vision.encoder.num_layers),
        Rule("logit_scale", "logit_scale"),
    ]


def _vision_rules(ours: str) -> list[Rule]:
    """The vision tower up to its last layer, our weights under `ours` ("" = the top)."""
    at = f"{ours}/" if ours else ""
    return [
        Rule("vision_model.embeddings.class_embedding", f"{at}class_embedding"),
        Rule("vision_model.embeddings.patch_embedding.weight", f"{at}patch/kernel", CONV),
        Rule(
            "vision_model.embeddings.position_embedding.weight",
            f"{at}position_embedding/embedding",
        ),
        *layer_norm("vision_model.pre_layrnorm", f"{at}pre_norm"),
        *tower_rules("vision_model", ours),
    ]


def classifier_rules(config: CLIPClassifierConfig) -> list[Rule]:
    head = dense("classifier", "classifier") if config.num_labels else []
    return [*expand(_vision_rules(""), config.encoder.num_layers), *head]


def _tower(hf: dict[str, Any], key: str) -> dict[str, Any]:
    # Old configs duplicate each tower as `*_config_dict`; `transformers` let those win.
    tower = {**field(hf, key, dict, {}), **field(hf, f"{key}_dict", dict, {})}
    check_fields(tower, TEXT_HANDLED if key == "text_config" else VISION_HANDLED, f"CLIP {key}")
    return tower


def _encoder(hf: dict[str, Any], where: str, causal: bool) -> EncoderConfig:
    return encoder_config(
        hf,
        where,
        pre_norm=True,
        causal=causal,
        layer_norm_eps=1e-5,
        dropout_fields=("dropout", "attention_dropout"),
    )


def _vision_config(vision: dict[str, Any]) -> CLIPVisionConfig:
    return CLIPVisionConfig(
        encoder=_encoder(vision, "CLIP vision", causal=False),
        image_size=field(vision, "image_size", int, 224),
        patch_size=field(vision, "patch_size", int, 32),
        num_channels=field(vision, "num_channels", int, 3),
    )


def classifier_config_from_hf(hf: dict[str, Any]) -> CLIPClassifierConfig:
    check_fields(hf, HANDLED, "CLIP")
    vision = _vision_config(_tower(hf, "vision_config"))
    return CLIPClassifierConfig(vision, num_labels(hf, "ForImageClassification"))


def config_from_hf(hf: dict[str, Any]) -> CLIPConfig:
    check_fields(hf, HANDLED, "CLIP")
    text, vision = _tower(hf, "text_config"), _tower(hf, "vision_config")
    return CLIPConfig(
        text=CLIPTextConfig(
            encoder=_encoder(text, "CLIP text", causal=True),
            vocab_size=field(text, "vocab_size", int),
            max_positions=field(text, "max_position_embeddings", int, 77),
            eos_token_id=field(text, "eos_token_id", int, 2),
        ),
        vision=_vision_config(vision),
        projection_dim=field(hf, "projection_dim", int, 512),
        logit_scale_init=float(field(hf, "logit_scale_init_value", float, 2.6592)),
    )


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    if CLASSIFIER in field(hf, "architectures", list, []):
        config = classifier_config_from_hf(hf)
        unused = (*IGNORED, re.escape(_POST_NORM) + r"\..*")  # the final LayerNorm, unread
        return load_model(config, classifier_rules(config), tensors, unused)
    config = config_from_hf(hf)
    return load_model(config, rules_for(config), tensors, IGNORED)


def _tower_hf(e: EncoderConfig, where: str, model_type: str) -> dict[str, Any]:
    return {
        **encoder_hf_fields(e, where),
        "model_type": model_type,
        "dropout": e.dropout,
        "attention_dropout": e.attention_dropout,
    }


def _vision_hf(vision: CLIPVisionConfig) -> dict[str, Any]:
    return {
        **_tower_hf(vision.encoder, "CLIP vision", "clip_vision_model"),
        "image_size": vision.image_size,
        "patch_size": vision.patch_size,
        "num_channels": vision.num_channels,
    }


def hf_config(c: CLIPConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["CLIPModel"],
        "projection_dim": c.projection_dim,
        "logit_scale_init_value": c.logit_scale_init,
        "text_config": {
            **_tower_hf(c.text.encoder, "CLIP text", "clip_text_model"),
            "vocab_size": c.text.vocab_size,
            "max_position_embeddings": c.text.max_positions,
            "eos_token_id": c.text.eos_token_id,
        },
        "vision_config": _vision_hf(c.vision),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if isinstance(c, CLIPClassifierConfig):
        tensors = to_hf_tensors(classifier_rules(c), model.params)
        D = c.encoder.width
        tensors[f"{_POST_NORM}.weight"] = np.ones(D, np.float32)  # unread by the classifier
        tensors[f"{_POST_NORM}.bias"] = np.zeros(D, np.float32)
        hf = {
            "model_type": MODEL_TYPE,
            "architectures": [CLASSIFIER],
            "text_config": {},
            "vision_config": _vision_hf(c.vision),
            **label_fields(c.num_labels),
        }
        write_hf(path, hf, tensors)
        return
    if not isinstance(c, CLIPConfig):
        raise ConversionError(f"expected a CLIP model, got {type(c).__name__}")
    write_hf(path, hf_config(c), to_hf_tensors(rules_for(c), model.params))
