"""HuggingFace DINOv2 (Dinov2Model, Dinov2ForImageClassification) and DINOv2 with registers
(Dinov2WithRegistersModel, ...ForImageClassification) <-> ours.

A pre-LN ViT stack with LayerScale (`layer_scale1/2.lambda1` -> `attention_scale`,
`mlp_scale`), positions resized bicubically to the image, and a classifier on the CLS token
concatenated with the mean patch token. SwiGLU MLPs (`use_swiglu_ffn`, the giant models) are
our gated MLP: `weights_in` is `fc1` (the SiLU input, then the gate), `weights_out` is `fc2`.
Register tokens follow CLS; `transformers` resizes the positions of a model with registers
with antialiasing, which we do not model, so such a model takes its checkpoint's image size
only. The mask token (used only in self-supervised pre-training, with `bool_masked_pos`) is not
modelled: it is read past, and an export leaves it to `transformers`' initialisation, which
changes no output.
"""

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
from hydra_jax.models import EncoderConfig, Model, ViTConfig
from hydra_jax.models.encoder import ACTIVATIONS

MODEL_TYPE = "dinov2"
REGISTERS = "dinov2_with_registers"
# model_type -> (the backbone's prefix in a classifier checkpoint, the HF class-name stem).
NAMES = {MODEL_TYPE: ("dinov2.", "Dinov2"), REGISTERS: (f"{REGISTERS}.", "Dinov2WithRegisters")}
MODEL_TYPES = tuple(NAMES)  # the HF `model_type`s this converter reads
HANDLED = (
    *ENCODER_FIELDS,
    "mlp_ratio",
    "image_size",
    "patch_size",
    "num_channels",
    "qkv_bias",
    "layerscale_value",
    "drop_path_rate",
    "use_swiglu_ffn",
    "use_mask_token",
    "apply_layernorm",
    "reshape_hidden_states",
    "out_features",
    "out_indices",
    "stage_names",
)
# `layerscale_value` initialises the scales and `drop_path_rate` is a training regulariser;
# the `out_*`, `stage_names`, `apply_layernorm` and `reshape_hidden_states` fields configure
# Dinov2Backbone's feature maps, which we do not model.
IGNORED = (r"embeddings\.mask_token",)

_LAYER = "encoder.layer.{l}"
_OURS = "encoder/layer_{l}"


def swiglu_width(D: int, ratio: int | float) -> int:
    """DINOv2's SwiGLU hidden width: two thirds of `D * ratio`, rounded up to a multiple of 8."""
    return (int(int(D * ratio) * 2 / 3) + 7) // 8 * 8


def rules_for(config: ViTConfig) -> list[Rule]:
    mlp = ("weights_in", "weights_out") if config.encoder.gated_mlp else ("fc1", "fc2")
    rules = [
        Rule("embeddings.cls_token", "cls_token", SQUEEZE_2),
        Rule("embeddings.position_embeddings", "position_embeddings", SQUEEZE_1),
        Rule("embeddings.patch_embeddings.projection.weight", "patch/kernel", CONV),
        Rule("embeddings.patch_embeddings.projection.bias", "patch/bias"),
        *layer_norm(f"{_LAYER}.norm1", f"{_OURS}/attention_norm"),
        *attention(
            tuple(f"{_LAYER}.attention.attention.{n}" for n in ("query", "key", "value")),
            f"{_LAYER}.attention.output.dense",
            f"{_OURS}/attention",
            qkv_bias=config.encoder.qkv_bias,
        ),
        Rule(f"{_LAYER}.layer_scale1.lambda1", f"{_OURS}/attention_scale"),
        *layer_norm(f"{_LAYER}.norm2", f"{_OURS}/mlp_norm"),
        *dense(f"{_LAYER}.mlp.{mlp[0]}", f"{_OURS}/mlp/fc1"),
        *dense(f"{_LAYER}.mlp.{mlp[1]}", f"{_OURS}/mlp/fc2"),
        Rule(f"{_LAYER}.layer_scale2.lambda1", f"{_OURS}/mlp_scale"),
        *layer_norm("layernorm", "final_norm"),
    ]
    if config.register_tokens:
        rules.append(Rule("embeddings.register_tokens", "register_tokens", SQUEEZE_1))
    if config.num_labels:
        rules += dense("classifier", "classifier")
    return expand(rules, config.encoder.num_layers)


def config_from_hf(hf: dict[str, Any]) -> ViTConfig:
    model_type = field(hf, "model_type", str)
    registers = model_type == REGISTERS
    check_fields(hf, (*HANDLED, "num_register_tokens") if registers else HANDLED, "DINOv2")
    swiglu = field(hf, "use_swiglu_ffn", bool, False)
    act = "silu" if swiglu else field(hf, "hidden_act", str, "gelu")
    require(act in ACTIVATIONS, f"DINOv2 hidden_act={act!r} unsupported")
    D, N = field(hf, "hidden_size", int, 768), field(hf, "num_attention_heads", int, 12)
    L = field(hf, "num_hidden_layers", int, 12)
    ratio = field(hf, "mlp_ratio", (int, float), 4)
    F = swiglu_width(D, ratio) if swiglu else int(D * ratio)  # as HF 5 sizes them
    require(min(D, N, L, F) > 0, f"DINOv2 sizes must be positive: D={D}, N={N}, L={L}, F={F}")
    require(D % N == 0, f"DINOv2 hidden_size {D} is not divisible by num_attention_heads {N}")
    encoder = EncoderConfig(
        num_heads=(N,) * L,
        width=D,
        head_dim=D // N,
        mlp_dim=F,
        activation=act,
        layer_norm_eps=float(field(hf, "layer_norm_eps", float, 1e-6)),
        pre_norm=True,
        qkv_bias=field(hf, "qkv_bias", bool, True),
        dropout=float(field(hf, "hidden_dropout_prob", float, 0.0)),
        attention_dropout=float(field(hf, "attention_probs_dropout_prob", float, 0.0)),
        layer_scale=True,
        gated_mlp=swiglu,
    )
    R = field(hf, "num_register_tokens", int, 4) if registers else 0
    require(R >= 0, f"DINOv2 num_register_tokens must be at least 0, got {R}")
    return ViTConfig(
        encoder=encoder,
        image_size=field(hf, "image_size", int, 224),
        patch_size=field(hf, "patch_size", int, 14),
        num_channels=field(hf, "num_channels", int, 3),
        pooler=False,  # Dinov2Model's pooler output is the final-LN CLS token itself
        num_labels=num_labels(hf, "ForImageClassification"),
        model_type=model_type,
        register_tokens=R,
    )


def load(hf: dict[str, Any], tensors: dict[str, Any]) -> Model:
    config = config_from_hf(hf)
    prefix = NAMES[config.model_type][0]
    return load_model(config, rules_for(config), strip_prefix(tensors, prefix), IGNORED)


def hf_config(c: ViTConfig) -> dict[str, Any]:
    """The HF `config.json` fields of `c` (inverse of `config_from_hf`)."""
    e = c.encoder
    require_full_heads(e, "DINOv2")
    sizes = f"MLP width {e.mlp_dim}, width {e.width}"
    if e.gated_mlp:
        ratios = [r for r in range(1, 17) if swiglu_width(e.width, r) == e.mlp_dim]
        require(bool(ratios), f"HF DINOv2's SwiGLU width is no integer mlp_ratio's: {sizes}")
        ratio = ratios[0]
    else:
        require(e.mlp_dim % e.width == 0, f"HF DINOv2 takes an integer mlp_ratio: {sizes}")
        ratio = e.mlp_dim // e.width
    stem = NAMES[c.model_type][1]
    return {
        "model_type": c.model_type,
        "architectures": [f"{stem}ForImageClassification" if c.num_labels else f"{stem}Model"],
        "hidden_size": e.width,
        "num_hidden_layers": e.num_layers,
        "num_attention_heads": e.num_heads[0],
        "mlp_ratio": ratio,
        "hidden_act": "gelu" if e.gated_mlp else e.activation,  # (SwiGLU's SiLU is fixed)
        "layer_norm_eps": e.layer_norm_eps,
        "hidden_dropout_prob": e.dropout,
        "attention_probs_dropout_prob": e.attention_dropout,
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.num_channels,
        "qkv_bias": e.qkv_bias,
        "use_swiglu_ffn": e.gated_mlp,
        **({"num_register_tokens": c.register_tokens} if c.model_type == REGISTERS else {}),
        **(label_fields(c.num_labels) if c.num_labels else {}),
    }


def export(model: Model, path: Path) -> None:
    """Writes `model` as an HF directory that `transformers` loads with identical outputs."""
    c = model.config
    if not isinstance(c, ViTConfig) or c.model_type not in NAMES:
        raise ConversionError(f"expected a DINOv2 model, got {type(c).__name__}")
    prefix = NAMES[c.model_type][0] if c.num_labels else ""
    write_hf(path, hf_config(c), to_hf_tensors(rules_for(c), model.params, prefix))
