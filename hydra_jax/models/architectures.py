"""The architecture table: each model family described once.

An `Architecture` says how to build a config's Flax module, which batch keys it reads and how
they are checked, the smallest batch that initialises it, where its layer stacks (`Tower`s) sit
in the config and in the weights and which head-mask argument masks each, which embedding tables
fusion shares, how a fresh classifier is made, and how a dual encoder's vision tower is taken.
`Model`, the input checks, `compact`, circuit search, fusion and the mesh rules read this table;
nothing else dispatches on config classes. The HF converters (`hydra_jax.convert`, a layer up)
are keyed by the HF `model_type` a config reports (`hf_model_type`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hydra_jax.models.bert import Bert, BertConfig
from hydra_jax.models.clip import (
    CLIP,
    LOGIT_SCALE_INIT,
    CLIPClassifier,
    CLIPClassifierConfig,
    CLIPConfig,
    CLIPVision,
    CLIPVisionTowerConfig,
)
from hydra_jax.models.config import EncoderConfig, member_of
from hydra_jax.models.dual_encoder import DualEncoder, DualEncoderConfig
from hydra_jax.models.inputs import check_pixels, check_text, concrete, token_types
from hydra_jax.models.modernbert import ModernBert, ModernBertConfig
from hydra_jax.models.siglip import (
    SIGLIP_LOGIT_BIAS_INIT,
    SIGLIP_LOGIT_SCALE_INIT,
    Siglip,
    SiglipClassifier,
    SiglipClassifierConfig,
    SiglipConfig,
    SiglipVision,
    SiglipVisionTowerConfig,
)
from hydra_jax.models.vit import ViT, ViTConfig

if TYPE_CHECKING:
    from hydra_jax.models.kinds import ArchConfig

# The members' architecture of an ensemble: a family with a single encoder.
MemberConfig = (
    BertConfig
    | ModernBertConfig
    | ViTConfig
    | CLIPVisionTowerConfig
    | CLIPClassifierConfig
    | SiglipVisionTowerConfig
    | SiglipClassifierConfig
)
# One model's config, of any family.
FamilyConfig = MemberConfig | CLIPConfig | DualEncoderConfig | SiglipConfig

Params = Any
Head = Callable[[Any, int, jax.Array], dict[str, Any]]  # (config, classes, key) -> head weights


@dataclasses.dataclass(frozen=True)
class Tower:
    """One layer stack of an architecture.

    Attributes:
      config: attribute path from the architecture's config to the config holding `encoder`
        (`()`: the config itself).
      params: key path from the weights to the weights holding `encoder` (`()`: the top).
      head_mask: the keyword argument of `Model.apply` that masks its heads.
    """

    config: tuple[str, ...]
    params: tuple[str, ...]
    head_mask: str


@dataclasses.dataclass(frozen=True)
class Architecture:
    """How one config class is built, fed, checked and transformed.

    Attributes:
      module: config -> its Flax module.
      inputs: the batch keys it reads (`labels` may ride along and is ignored).
      check: `(config, batch)`: raises ValueError naming what the batch gets wrong (shapes, and
        values where known); generic checks (empty batch, masks) run for every family.
      dummy: config -> the smallest batch that initialises every weight.
      towers: name -> `Tower`; a single-encoder family has one, named "" (it has `embed` /
        `encode` / `head` stages, so scoring, circuit search and fusion apply to it).
      shared_tables: top-level weights that fusion averages over members (a family that fusion
        takes; None where it does not).
      head: a fresh `num_labels`-way classifier's weights (`with_classifier`), or None.
      vision_tower: `(config, weights) -> (config, weights)` of the vision tower as a model of
        its own (dual encoders), or None.
      image_classifier: `(config, weights) -> (config, weights)` of the vision tower as its
        family's HF image classifier, without a classifier yet (`with_classifier` adds one), or
        None.
      prompt_length: config -> the fixed length a dual encoder's text is padded to (SigLIP's
        text tower reads its last position, and `transformers`' zero-shot pipeline pads to
        its positions), or None: padded to the longest text.
      hf_model_type: config -> the HF `model_type` it loads from and exports to.
    """

    module: Callable[[Any], nn.Module]
    inputs: tuple[str, ...]
    check: Callable[[Any, Mapping[str, Any]], None]
    dummy: Callable[[Any], dict[str, jax.Array]]
    towers: Mapping[str, Tower]
    hf_model_type: Callable[[Any], str | None]
    shared_tables: tuple[str, ...] | None = None
    head: Head | None = None
    vision_tower: Callable[[Any, Params], tuple[Any, Params]] | None = None
    image_classifier: Callable[[Any, Params], tuple[Any, Params]] | None = None
    prompt_length: Callable[[Any], int] | None = None


def _ids() -> jax.Array:
    return jnp.zeros((1, 1), jnp.int32)


def _image(image_size: int, num_channels: int) -> jax.Array:
    return jnp.zeros((1, num_channels, image_size, image_size), jnp.float32)


def _check_bert(c: BertConfig, inputs: Mapping[str, Any]) -> None:
    check_text(inputs, c.vocab_size, c.max_tokens, token_types(c))


def _check_modernbert(c: ModernBertConfig, inputs: Mapping[str, Any]) -> None:
    check_text(inputs, c.vocab_size, c.max_tokens, None)  # token types ignored, as in HF


def _check_vit(c: ViTConfig, inputs: Mapping[str, Any]) -> None:
    # DINOv2 resizes its positions for other sizes (with registers, `transformers` resizes
    # with antialiasing, which we do not model: the checkpoint's size only).
    any_size = c.patch_size if c.model_type == "dinov2" else 0
    check_pixels(inputs.get("pixel_values"), c.image_size, c.num_channels, any_size)


def _check_clip(c: CLIPConfig, inputs: Mapping[str, Any]) -> None:
    check_text(inputs, c.text.vocab_size, c.text.max_positions, None)
    check_pixels(inputs.get("pixel_values"), c.vision.image_size, c.vision.num_channels)


def _check_siglip(c: SiglipConfig, inputs: Mapping[str, Any]) -> None:
    check_text(inputs, c.text.vocab_size, c.text.max_positions, None)
    check_pixels(inputs.get("pixel_values"), c.vision.image_size, c.vision.num_channels)


def _check_dual(c: DualEncoderConfig, inputs: Mapping[str, Any]) -> None:
    _check_bert(c.text, inputs)
    _check_vit(c.vision, inputs)


def _dense(key: jax.Array, inputs: int, outputs: int) -> dict[str, jax.Array]:
    """A dense layer initialised as `transformers` does: normal(0.02) kernel, zero bias."""
    kernel = 0.02 * jax.random.normal(key, (inputs, outputs), jnp.float32)
    return {"kernel": kernel, "bias": jnp.zeros(outputs)}


def _zero_shot_head(E: int, num_labels: int, key: jax.Array) -> dict[str, Any]:
    """Random class embeddings `[C, E]` and CLIP's initial logit scale (`zero_shot` puts prompt
    embeddings there)."""
    return {
        "class_embeds": 0.02 * jax.random.normal(key, (num_labels, E), jnp.float32),
        "logit_scale": jnp.asarray(LOGIT_SCALE_INIT, jnp.float32),
    }


def _siglip_head(c: SiglipVisionTowerConfig, num_labels: int, key: jax.Array) -> dict[str, Any]:
    """Random class embeddings `[C, D]` and SigLIP's initial logit scale and bias."""
    return {
        "class_embeds": 0.02 * jax.random.normal(key, (num_labels, c.encoder.width), jnp.float32),
        "logit_scale": jnp.asarray(SIGLIP_LOGIT_SCALE_INIT, jnp.float32),
        "logit_bias": jnp.asarray(SIGLIP_LOGIT_BIAS_INIT, jnp.float32),
    }


def _linear_head(c: Any, num_labels: int, key: jax.Array) -> dict[str, Any]:
    """HF's image classifiers of a dual encoder's vision tower: one dense layer."""
    return {"classifier": _dense(key, c.encoder.width, num_labels)}


def _bert_head(c: BertConfig, num_labels: int, key: jax.Array) -> dict[str, Any]:
    """BERT: a dense layer on the tanh pooler, which must exist; RoBERTa, ELECTRA, DistilBERT and
    DeBERTa: their two-layer head (`pre_classifier`, then `classifier`)."""
    D = c.encoder.width
    if c.variant.head == "pooler":
        if not c.pooler:
            raise ValueError("a BERT sequence classifier reads the pooler, which this model lacks")
        return {"classifier": _dense(key, D, num_labels)}
    return {
        "classifier": _dense(key, D, num_labels),
        "pre_classifier": _dense(jax.random.fold_in(key, 1), D, D),
    }


def _modernbert_head(c: ModernBertConfig, num_labels: int, key: jax.Array) -> dict[str, Any]:
    """The head's dense layer (a bias only with `head_bias`) and norm, then the classifier."""
    D = c.encoder.width
    dense = _dense(jax.random.fold_in(key, 1), D, D)
    norm = {"scale": jnp.ones(D)} | ({"bias": jnp.zeros(D)} if c.encoder.norm_bias else {})
    return {
        "classifier": _dense(key, D, num_labels),
        "pre_classifier": dense if c.head_bias else {"kernel": dense["kernel"]},
        "head_norm": norm,
    }


def _vit_head(c: ViTConfig, num_labels: int, key: jax.Array) -> dict[str, Any]:
    """A dense layer on CLS (DINOv2: on `[CLS, mean patch]`; DeiT with its teacher's head: a
    `distillation_classifier` too); a dual encoder's tower (`projection_dim`): zero-shot."""
    if c.projection_dim:
        return _zero_shot_head(c.projection_dim, num_labels, key)
    D = c.encoder.width
    head = {"classifier": _dense(key, 2 * D if c.dinov2 else D, num_labels)}
    if c.distilled_head:
        head["distillation_classifier"] = _dense(jax.random.fold_in(key, 2), D, num_labels)
    return head


def _clip_vision_tower(c: CLIPConfig, params: Params) -> tuple[CLIPVisionTowerConfig, Params]:
    return CLIPVisionTowerConfig(c.vision, c.projection_dim), params["vision"]


def _clip_image_classifier(c: CLIPConfig, params: Params) -> tuple[Any, Params]:
    """`CLIPForImageClassification`'s network: the vision tower without its final LayerNorm and
    projection."""
    vision = {k: v for k, v in params["vision"].items() if k not in ("post_norm", "projection")}
    return CLIPClassifierConfig(c.vision), vision


def _siglip_vision_tower(c: SiglipConfig, params: Params) -> tuple[Any, Params]:
    return SiglipVisionTowerConfig(c.vision), params["vision"]


def _siglip_image_classifier(c: SiglipConfig, params: Params) -> tuple[Any, Params]:
    """`SiglipForImageClassification`'s network: the vision tower without its pooling head."""
    vision = {k: v for k, v in params["vision"].items() if k != "pool"}
    return SiglipClassifierConfig(c.vision), vision


def _dual_vision_tower(c: DualEncoderConfig, params: Params) -> tuple[ViTConfig, Params]:
    vit = dataclasses.replace(c.vision, num_labels=0, projection_dim=c.projection_dim)
    return vit, {**params["vision_model"], "projection": params["visual_projection"]}


_SINGLE = {"": Tower((), (), "head_mask")}


def _two_towers(text: str, vision: str) -> dict[str, Tower]:
    """A dual encoder's towers, their weights under `text` and `vision`."""
    return {
        "text": Tower(("text",), (text,), "text_head_mask"),
        "vision": Tower(("vision",), (vision,), "vision_head_mask"),
    }


def _text_and_image(c: Any) -> dict[str, jax.Array]:
    return {"input_ids": _ids(), "pixel_values": _image(c.vision.image_size, c.vision.num_channels)}


def _vision_model(
    module: Callable[[Any], nn.Module],
    head: Head,
    hf_model_type: str | None,
    tables: tuple[str, ...],
) -> Architecture:
    """A dual encoder's vision tower as a model of its own (pixels in; its layers under
    `config.vision`, its weights at the top): a zero-shot tower or an HF image classifier."""
    return Architecture(
        module=module,
        inputs=("pixel_values",),
        check=lambda c, inputs: check_pixels(
            inputs.get("pixel_values"), c.vision.image_size, c.vision.num_channels
        ),
        dummy=lambda c: {"pixel_values": _image(c.vision.image_size, c.vision.num_channels)},
        towers={"": Tower(("vision",), (), "head_mask")},
        hf_model_type=lambda c: hf_model_type,
        shared_tables=tables,
        head=head,
    )


TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

ARCHITECTURES: dict[type, Architecture] = {
    BertConfig: Architecture(
        module=Bert,
        inputs=TEXT_INPUTS,
        check=_check_bert,
        dummy=lambda c: {"input_ids": _ids()},
        towers=_SINGLE,
        hf_model_type=lambda c: c.model_type,
        shared_tables=("word_embeddings", "position_embeddings", "token_type_embeddings"),
        head=_bert_head,
    ),
    ModernBertConfig: Architecture(
        module=ModernBert,
        inputs=TEXT_INPUTS,
        check=_check_modernbert,
        dummy=lambda c: {"input_ids": _ids()},
        towers=_SINGLE,
        hf_model_type=lambda c: "modernbert",
        shared_tables=("word_embeddings",),
        head=_modernbert_head,
    ),
    ViTConfig: Architecture(
        module=ViT,
        inputs=("pixel_values",),
        check=_check_vit,
        dummy=lambda c: {"pixel_values": _image(c.image_size, c.num_channels)},
        towers=_SINGLE,
        hf_model_type=lambda c: c.model_type,
        shared_tables=(
            "patch",
            "cls_token",
            "distillation_token",
            "register_tokens",
            "position_embeddings",
        ),
        head=_vit_head,
    ),
    CLIPVisionTowerConfig: _vision_model(
        lambda c: CLIPVision(c.vision, c.projection_dim, c.num_labels),
        lambda c, num_labels, key: _zero_shot_head(c.projection_dim, num_labels, key),
        None,
        ("patch", "class_embedding", "position_embedding"),
    ),
    CLIPClassifierConfig: _vision_model(
        lambda c: CLIPClassifier(c.vision, 0, c.num_labels),
        _linear_head,
        "clip",
        ("patch", "class_embedding", "position_embedding"),
    ),
    CLIPConfig: Architecture(
        module=CLIP,
        inputs=("input_ids", "attention_mask", "pixel_values"),
        check=_check_clip,
        dummy=_text_and_image,
        towers=_two_towers("text", "vision"),
        hf_model_type=lambda c: "clip",
        vision_tower=_clip_vision_tower,
        image_classifier=_clip_image_classifier,
    ),
    SiglipVisionTowerConfig: _vision_model(
        lambda c: SiglipVision(c.vision, c.num_labels),
        _siglip_head,
        None,
        ("patch", "position_embedding"),
    ),
    SiglipClassifierConfig: _vision_model(
        lambda c: SiglipClassifier(c.vision, c.num_labels),
        _linear_head,
        "siglip",
        ("patch", "position_embedding"),
    ),
    SiglipConfig: Architecture(
        module=Siglip,
        inputs=("input_ids", "attention_mask", "pixel_values"),
        check=_check_siglip,
        dummy=_text_and_image,
        towers=_two_towers("text", "vision"),
        hf_model_type=lambda c: "siglip",
        vision_tower=_siglip_vision_tower,
        image_classifier=_siglip_image_classifier,
        prompt_length=lambda c: c.text.max_positions,
    ),
    DualEncoderConfig: Architecture(
        module=DualEncoder,
        inputs=(*TEXT_INPUTS, "pixel_values"),
        check=_check_dual,
        dummy=_text_and_image,
        towers=_two_towers("text_model", "vision_model"),
        hf_model_type=lambda c: "vision-text-dual-encoder",
        vision_tower=_dual_vision_tower,
    ),
}
PASSIVE_INPUTS = ("labels",)
# Top-level weights of a classifier head, in every family (`with_classifier` replaces them).
CLASSIFIER_PARAMS = (
    "pre_classifier",
    "classifier",
    "head_norm",
    "distillation_classifier",
    "class_embeds",
    "logit_scale",
    "logit_bias",
)


def architecture(config: ArchConfig) -> Architecture:
    """The table entry of `config`'s class (an ensemble: its members')."""
    config = member_of(config) or config
    if type(config) not in ARCHITECTURES:
        known = sorted(c.__name__ for c in ARCHITECTURES)
        raise TypeError(f"no architecture for {type(config).__name__}; known: {known}")
    return ARCHITECTURES[type(config)]


def module_of(config: ArchConfig) -> nn.Module:
    """The Flax module of a (non-fused) config."""
    return architecture(config).module(config)


def input_names(config: ArchConfig) -> tuple[str, ...]:
    """The batch keys a model of `config` reads."""
    return architecture(config).inputs


def dummy_inputs(config: ArchConfig) -> dict[str, jax.Array]:
    """The smallest batch that initialises every weight of `config`'s architecture."""
    return architecture(config).dummy(config)


def tower_config(config: ArchConfig, tower: Tower) -> Any:
    """The config that holds the tower's `encoder`."""
    for name in tower.config:
        config = getattr(config, name)
    return config


def tower_encoder(config: ArchConfig, tower: Tower) -> EncoderConfig:
    return tower_config(config, tower).encoder


def with_tower_encoder(config: Any, path: Sequence[str], encoder: EncoderConfig) -> Any:
    """`config` with the encoder at attribute `path` replaced."""
    if not path:
        return dataclasses.replace(config, encoder=encoder)
    inner = with_tower_encoder(getattr(config, path[0]), path[1:], encoder)
    return dataclasses.replace(config, **{path[0]: inner})


def weight_count(params: Params) -> int:
    """The number of weights in the pytree `params` (arrays or `jax.ShapeDtypeStruct`s)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def tower_params(params: Params, tower: Tower) -> Params:
    for key in tower.params:
        params = params[key]
    return params


def with_tower_params(params: Params, path: Sequence[str], tower: Params) -> Params:
    """`params` with the weights at key `path` replaced (a new dict at each level)."""
    if not path:
        return tower
    return {**params, path[0]: with_tower_params(params[path[0]], path[1:], tower)}


def single_tower(config: ArchConfig) -> Tower | None:
    """The one tower of a single-encoder family (BERT, ViT, a CLIP vision tower), else None."""
    towers = architecture(config).towers
    return towers[""] if "" in towers and member_of(config) is None else None


def encoder_of(config: ArchConfig) -> EncoderConfig:
    """The layer stack of a single-encoder model (BERT, ViT, a CLIP vision tower)."""
    tower = single_tower(config)
    if tower is None:
        raise TypeError(f"a {type(config).__name__} has no single encoder")
    return tower_encoder(config, tower)


def head_mask_encoders(config: ArchConfig) -> dict[str, EncoderConfig]:
    """Name of each head-mask argument -> the encoder it masks (none for a fused Hydra, whose
    members are already pruned)."""
    if member_of(config) is not None:
        return {}
    towers = architecture(config).towers.values()
    return {t.head_mask: tower_encoder(config, t) for t in towers}


def check_inputs(config: ArchConfig, inputs: Mapping[str, Any]) -> None:
    """Shapes, and values where they are known (outside `jit`), of a batch for `config`.

    Raises:
      ValueError: an empty batch; an example with no real token; ids or token types outside
        the model's tables; more tokens than positions; mismatched mask shapes; pixel values
        that are not floats, not finite, or in another layout or size; a head mask with
        NaN/inf; an attention mask that is not 0/1.
    """
    for name in ("input_ids", "pixel_values"):
        if inputs.get(name) is not None and np.shape(inputs[name])[:1] == (0,):
            raise ValueError(f"empty batch: {name} has shape {np.shape(inputs[name])}")
    member = member_of(config) or config
    architecture(member).check(member, inputs)
    for name in ("head_mask", "text_head_mask", "vision_head_mask"):
        mask = inputs.get(name)
        rows = mask if isinstance(mask, Sequence) else [mask]
        if any((v := concrete(r)) is not None and not np.all(np.isfinite(v)) for r in rows):
            raise ValueError(f"{name} contains NaN/inf")
    mask = concrete(inputs.get("attention_mask"))
    if mask is None or mask.ndim != 2:
        return
    if not np.isin(mask, (0, 1)).all():
        values = np.unique(mask)[:6].tolist()
        raise ValueError(f"attention_mask must be 0 (padding) or 1 (a token); it holds {values}")
    empty = np.nonzero(mask.sum(-1) == 0)[0]
    if empty.size:
        raise ValueError(
            f"examples {empty.tolist()} of the batch are all padding (attention_mask all 0): "
            "nothing to attend to"
        )
