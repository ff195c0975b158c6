"""HuggingFace VisionTextDualEncoderModel (a ViT and a BERT) <-> ours, both ways, strictly.

The towers use the ViT and BERT tables under `vision_model.` / `text_model.`; `transformers`
builds both with their poolers (`AutoModel`), whose outputs the projections read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hydra_jax.convert import bert, vit
from hydra_jax.convert.common import (
    ConversionError,
    Rule,
    check_fields,
    dense,
    field,
    load_model,
    require,
    to_hf_tensors,
    write_hf,
)
from hydra_jax.models import DualEncoderConfig, Model

MODEL_TYPE = "vision-text-dual-encoder"
MODEL_TYPES = (MODEL_TYPE,)  # the HF `model_type`s this converter reads
HANDLED = ("projection_dim", "logit_scale_init_value", "vision_config", "text_config")
IGNORED = (r"(text|vision)_model\.embeddings\.position_ids",)


def _tower(rules: list[Rule], hf: str, ours: str) -> list[Rule]:
    return [Rule(f"{hf}.{r.hf}", f"{ours}/{r.ours}", r.transform) for r in rules]


def rules_for(config: DualEncoderConfig) -> list[Rule]:
    return [
        *_tower(vit.rules_for(config.vision), "vision_model", "vision_model"),
        *_tower(bert.rules_for(config.text), "text_model", "text_model"),
        *dense("visual_projection", "visual_projection", bias=False),
        *dense("text_projection", "text_projection", bias=False),
        Rule("logit_scale", "logit_scale"),
    ]


def _sub_config(hf: dict[str, Any], key: str, model_type: str) -> dict[str, Any]:
    sub = field(hf, key, dict)
    kind = sub.get("model_type")
    require(
        kind == model_type,
        f"{key}.model_type is {kind!r}: this converter reads a "
        f"{model_type!r} {key.split('_')[0]} tower only",
    )
    return {k: v for k, v in sub.items() if k != "model_type"}


def config_from_hf(hf: dict[str, Any]) -> DualEncoderConfig:
    check_fields(hf, HANDLED, "VisionTextDualEncoder")
    vision = vit.config_from_hf(_sub_config(hf, "vision_config", "vit"), has_pooler=True)
    text = bert.config_from_hf(_sub_config(hf, "text_config", "bert"), has_pooler=True)
    return DualEncoderConfig(
        vision=dataclasses.replace(vision, num_labels=0),
        text=dataclasses.replace(text, num_labels=0),
        projection_dim=field(hf, "projection_dim", int, 512),
        logit_scale_init=float(field(hf, "logit_scale_init_value", float, 2.6592)),
    )


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    config = config_from_hf(hf)
    return load_model(config, rules_for(config), tensors, IGNORED)


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, DualEncoderConfig):
        raise ConversionError(f"expected a dual encoder, got {type(c).__name__}")
    hf = {
        "model_type": MODEL_TYPE,
        "architectures": ["VisionTextDualEncoderModel"],
        "projection_dim": c.projection_dim,
        "logit_scale_init_value": c.logit_scale_init,
        "vision_config": {**vit.hf_config(c.vision), "architectures": ["ViTModel"]},
        "text_config": {**bert.hf_config(c.text), "architectures": ["BertModel"]},
    }
    write_hf(path, hf, to_hf_tensors(rules_for(c), model.params))
