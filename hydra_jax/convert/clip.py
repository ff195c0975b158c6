"""HuggingFace CLIPModel -> ours (both towers, projections, logit scale)."""

from __future__ import annotations

from typing import Any

from hydra_jax.convert.common import (
    CONV,
    Rule,
    attention,
    check_fields,
    dense,
    encoder_config,
    expand,
    field,
    layer_norm,
    load_model,
)
from hydra_jax.models import CLIPConfig, CLIPTextConfig, CLIPVisionConfig, EncoderConfig, Model

HANDLED = (
    "projection_dim", "logit_scale_init_value", "text_config", "vision_config",
    "text_config_dict", "vision_config_dict",
)  # fmt: skip
_TOWER = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
    "layer_norm_eps", "attention_dropout", "dropout",
    # The tower's own projection_dim only configures CLIP{Text,Vision}ModelWithProjection;
    # CLIPModel uses the top-level one.
    "projection_dim",
)  # fmt: skip
TEXT_HANDLED = (*_TOWER, "vocab_size", "max_position_embeddings", "eos_token_id")
VISION_HANDLED = (*_TOWER, "image_size", "patch_size", "num_channels")

IGNORED = (r"(text|vision)_model\.embeddings\.position_ids",)


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
        Rule("vision_model.embeddings.class_embedding", "vision/class_embedding"),
        Rule("vision_model.embeddings.patch_embedding.weight", "vision/patch/kernel", CONV),
        Rule(
            "vision_model.embeddings.position_embedding.weight",
            "vision/position_embedding/embedding",
        ),
        *layer_norm("vision_model.pre_layrnorm", "vision/pre_norm"),
        *tower_rules("vision_model", "vision"),
        *layer_norm("vision_model.post_layernorm", "vision/post_norm"),
        *dense("visual_projection", "vision/projection", bias=False),
    ]
    return [
        *expand(text, config.text.encoder.num_layers),
        *expand(vision, config.vision.encoder.num_layers),
        Rule("logit_scale", "logit_scale"),
    ]


def _tower(hf: dict[str, Any], key: str) -> dict[str, Any]:
    # Old configs duplicate each tower as `*_config_dict`; `transformers` let those win.
    tower = {**field(hf, key, dict, {}), **field(hf, f"{key}_dict", dict, {})}
    check_fields(tower, TEXT_HANDLED if key == "text_config" else VISION_HANDLED, f"CLIP {key}")
    return tower


def _encoder(hf: dict[str, Any], where: str, causal: bool) -> EncoderConfig:
    return encoder_config(hf, where, pre_norm=True, causal=causal, layer_norm_eps=1e-5,
                          dropout_fields=("dropout", "attention_dropout"))  # fmt: skip


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
        vision=CLIPVisionConfig(
            encoder=_encoder(vision, "CLIP vision", causal=False),
            image_size=field(vision, "image_size", int, 224),
            patch_size=field(vision, "patch_size", int, 32),
            num_channels=field(vision, "num_channels", int, 3),
        ),
        projection_dim=field(hf, "projection_dim", int, 512),
        logit_scale_init=float(field(hf, "logit_scale_init_value", float, 2.6592)),
    )


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    config = config_from_hf(hf)
    return load_model(config, rules_for(config), tensors, IGNORED)
