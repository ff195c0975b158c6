"""`Model`: a config, a plain pytree of weights and a pure `apply`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hydra_jax.models import fused
from hydra_jax.models.bert import Bert
from hydra_jax.models.clip import CLIP, LOGIT_SCALE_INIT, CLIPVision
from hydra_jax.models.config import (
    ArchConfig,
    BertConfig,
    CLIPConfig,
    CLIPVisionTowerConfig,
    EncoderConfig,
    HydraConfig,
    ViTConfig,
)
from hydra_jax.models.outputs import CLIPOutput, ModelOutput, Stem
from hydra_jax.models.vit import ViT

Params = Any  # a nested dict of arrays


def _module(config: ArchConfig) -> nn.Module:
    if isinstance(config, BertConfig):
        return Bert(config)
    if isinstance(config, ViTConfig):
        return ViT(config)
    if isinstance(config, CLIPConfig):
        return CLIP(config)
    if isinstance(config, CLIPVisionTowerConfig):
        return CLIPVision(config.vision, config.projection_dim, config.num_labels)
    raise TypeError(f"no module for {type(config).__name__}")


# Batch keys each architecture reads; `labels` may ride along in a batch and is ignored here.
_INPUTS: dict[type, tuple[str, ...]] = {
    BertConfig: ("input_ids", "attention_mask", "token_type_ids"),
    ViTConfig: ("pixel_values",),
    CLIPConfig: ("input_ids", "attention_mask", "pixel_values"),
    CLIPVisionTowerConfig: ("pixel_values",),
}
_PASSIVE_INPUTS = ("labels",)


def input_names(config: ArchConfig) -> tuple[str, ...]:
    """The batch keys a model of `config` reads."""
    if isinstance(config, HydraConfig):
        return input_names(config.member)
    return _INPUTS[type(config)]


def encoder_of(config: ArchConfig) -> EncoderConfig:
    """The layer stack of a single-encoder model (BERT, ViT, a CLIP vision tower)."""
    if isinstance(config, BertConfig | ViTConfig | CLIPVisionTowerConfig):
        return config.encoder
    raise TypeError(f"a {type(config).__name__} has no single encoder")


def head_mask_encoders(config: ArchConfig) -> dict[str, EncoderConfig]:
    """Name of each head-mask argument -> the encoder it masks."""
    if isinstance(config, CLIPConfig):
        return {"text_head_mask": config.text.encoder, "vision_head_mask": config.vision.encoder}
    if isinstance(config, HydraConfig):
        return {}  # members are already pruned; the fused model takes no head mask
    return {"head_mask": config.encoder}


def check_head_mask(mask: Any, encoder: EncoderConfig, name: str = "head_mask") -> None:
    """Raises ValueError unless `mask` is `[L, N]` (or L arrays `[N_l]` for unequal layers)."""
    counts = encoder.num_heads
    if len(set(counts)) == 1:
        expected = f"shape {(len(counts), counts[0])}"
    else:
        expected = f"a sequence of {len(counts)} arrays of shapes {[(n,) for n in counts]}"
    if isinstance(mask, Sequence) and not hasattr(mask, "shape"):
        shapes = [tuple(np.shape(m)) for m in mask]
    else:
        shape = tuple(np.shape(mask))
        shapes = [shape[1:]] * shape[0] if len(shape) == 2 else None
    if shapes != [(n,) for n in counts]:
        got = np.shape(mask) if hasattr(mask, "shape") else shapes
        raise ValueError(
            f"{name} has shape {got}, but this model has {len(counts)} layers with "
            f"{list(counts)} heads: expected {expected}"
        )


def _concrete(x: Any) -> np.ndarray | None:
    """`x` as numpy when its values are known (None under `jit`/`grad` tracing)."""
    return None if x is None or isinstance(x, jax.core.Tracer) else np.asarray(x)


def _check_ids(name: str, ids: Any, high: int, what: str) -> None:
    values = _concrete(ids)
    if values is None or values.size == 0:
        return
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {values.dtype}")
    bad = np.nonzero((values < 0) | (values >= high))
    if bad[0].size:
        where = tuple(int(i[0]) for i in bad)
        raise ValueError(
            f"{name} must lie in [0, {high}) ({what}); {bad[0].size} do not, e.g. "
            f"{int(values[where])} at {where}"
        )


def _check_text(inputs: Mapping[str, Any], vocab: int, positions: int, types: int | None) -> None:
    ids = inputs.get("input_ids")
    if ids is None:
        return
    shape = tuple(np.shape(ids))
    if len(shape) != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {shape}")
    if shape[1] > positions:
        raise ValueError(
            f"input_ids has {shape[1]} tokens, more than the model's {positions} positions"
        )
    for name in ("attention_mask", "token_type_ids"):
        if inputs.get(name) is not None and tuple(np.shape(inputs[name])) != shape:
            raise ValueError(
                f"{name} has shape {tuple(np.shape(inputs[name]))}, input_ids has {shape}"
            )
    _check_ids("input_ids", ids, vocab, "the vocabulary")
    if types is not None and inputs.get("token_type_ids") is not None:
        _check_ids("token_type_ids", inputs["token_type_ids"], types, "the token types")


def _check_pixels(pixels: Any, image_size: int, channels: int) -> None:
    if pixels is None:
        return
    shape = tuple(np.shape(pixels))
    expected = (channels, image_size, image_size)
    if len(shape) == 4 and shape[1:] == expected:
        return
    if len(shape) == 4 and shape[1:] == (image_size, image_size, channels):
        raise ValueError(
            f"pixel_values has shape {shape}: channels last (NHWC); this model takes [B, C, H, W]"
            f" = [B, {channels}, {image_size}, {image_size}] (transpose with (0, 3, 1, 2))"
        )
    raise ValueError(
        f"pixel_values has shape {shape}; this model takes [B, C, H, W] = "
        f"[B, {channels}, {image_size}, {image_size}]"
    )


def check_inputs(config: ArchConfig, inputs: Mapping[str, Any]) -> None:
    """Shapes, and values where they are known (outside `jit`), of a batch for `config`.

    Raises:
      ValueError: an empty batch; an example with no real token; ids or token types outside
        the model's tables; more tokens than positions; mismatched mask shapes; pixel values
        in another layout or size; a head mask with NaN/inf.
    """
    for name in ("input_ids", "pixel_values"):
        if inputs.get(name) is not None and np.shape(inputs[name])[:1] == (0,):
            raise ValueError(f"empty batch: {name} has shape {np.shape(inputs[name])}")
    bert = config.member if isinstance(config, HydraConfig) else config
    if isinstance(bert, CLIPVisionTowerConfig):
        _check_pixels(inputs.get("pixel_values"), bert.vision.image_size, bert.vision.num_channels)
    elif isinstance(bert, BertConfig):
        _check_text(inputs, bert.vocab_size, bert.max_positions, bert.type_vocab_size)
    elif isinstance(bert, ViTConfig):
        _check_pixels(inputs.get("pixel_values"), bert.image_size, bert.num_channels)
    elif isinstance(bert, CLIPConfig):
        _check_text(inputs, bert.text.vocab_size, bert.text.max_positions, None)
        vision = bert.vision
        _check_pixels(inputs.get("pixel_values"), vision.image_size, vision.num_channels)
    for name in ("head_mask", "text_head_mask", "vision_head_mask"):
        mask = inputs.get(name)
        rows = mask if isinstance(mask, Sequence) else [mask]
        if any((v := _concrete(r)) is not None and not np.all(np.isfinite(v)) for r in rows):
            raise ValueError(f"{name} contains NaN/inf")
    mask = _concrete(inputs.get("attention_mask"))
    if mask is None or mask.ndim != 2:
        return
    empty = np.nonzero(mask.sum(-1) == 0)[0]
    if empty.size:
        raise ValueError(
            f"examples {empty.tolist()} of the batch are all padding (attention_mask all 0): "
            "nothing to attend to"
        )


@dataclasses.dataclass(frozen=True)
class Model:
    """A transformer as a config, a weight pytree and a pure `apply`.

    `apply(params, **inputs)` is a pure function of arrays, safe under `jit`, `grad` and `vmap`;
    `model(**inputs)` is the same with `model.params`.
    """

    config: ArchConfig
    params: Params

    @property
    def module(self) -> nn.Module:
        return _module(self.config)

    @classmethod
    def init(cls, config: ArchConfig, rng: jax.Array) -> Model:
        """Randomly initialised weights (tests, training from scratch).

        A fused Hydra is initialised as the fusion of M independently initialised members.
        """
        if isinstance(config, HydraConfig):
            keys = jax.random.split(rng, config.num_members)
            members = [cls.init(config.member, k) for k in keys]
            return cls(config, fused.fuse_params(config.member, [m.params for m in members]))
        params = _module(config).init(rng, **dummy_inputs(config))["params"]
        return cls(config, params)

    def apply(
        self,
        params: Params,
        *,
        output_attentions: bool = False,
        dropout_rng: jax.Array | None = None,
        **inputs: Any,
    ) -> ModelOutput | CLIPOutput:
        """Runs the model.

        Args:
          params: the weight pytree (`model.params` or a transformed copy).
          output_attentions: also return attention probabilities `[L, B, N, T, S]`.
          dropout_rng: a PRNG key turns dropout on (training, MC dropout); None is inference.
          **inputs: HF-named batch arrays (`input_ids`, `attention_mask`, `token_type_ids`,
            `pixel_values` `[B, C, H, W]`; `labels` is ignored) and the head mask(s): `head_mask`
            `[L, N]` (CLIP: `text_head_mask`, `vision_head_mask`).

        Raises:
          TypeError: an input this architecture does not take.
          ValueError: a head mask of the wrong shape or with NaN/inf; a batch `check_inputs`
            refuses (empty, all padding, ids out of range, wrong shapes or image layout).
        """
        masks = head_mask_encoders(self.config)
        allowed = (*input_names(self.config), *masks, *_PASSIVE_INPUTS)
        unknown = sorted(set(inputs) - set(allowed))
        if unknown:
            raise TypeError(
                f"{type(self.config).__name__} model got unexpected inputs {unknown}; "
                f"it takes {list(allowed)}"
            )
        for name, encoder in masks.items():
            if inputs.get(name) is not None:
                check_head_mask(inputs[name], encoder, name)
        check_inputs(self.config, inputs)
        kwargs = {k: v for k, v in inputs.items() if k not in _PASSIVE_INPUTS and v is not None}
        if isinstance(self.config, HydraConfig):
            if output_attentions:
                raise NotImplementedError("the fused Hydra model does not return attention maps")
            return fused.apply(
                self.config, _module(self.config.member), params, kwargs, dropout_rng
            )
        rngs = None if dropout_rng is None else {"dropout": dropout_rng}
        return self.module.apply(
            {"params": params},
            **kwargs,
            output_attentions=output_attentions,
            deterministic=dropout_rng is None,
            rngs=rngs,
        )

    def __call__(self, **inputs: Any) -> ModelOutput | CLIPOutput:
        return self.apply(self.params, **inputs)

    # The three stages of a single-encoder model (BERT, ViT, CLIP vision tower):
    # `apply == head(encode(embed(inputs)))`. Circuit search and the fused Hydra compose them,
    # so nothing above the models reaches into a module's internals.

    def embed(self, params: Params, dropout_rng: jax.Array | None = None, **inputs: Any) -> Stem:
        """The hidden state entering layer 0 `[B, T, D]`, with the key padding of `inputs`."""
        self._single_encoder("embed")
        check_inputs(self.config, inputs)
        kwargs = {k: inputs[k] for k in input_names(self.config) if inputs.get(k) is not None}
        return self._stage("embed", params, dropout_rng, **kwargs)

    def encode(
        self,
        params: Params,
        stem: Stem,
        *,
        head_mask: Any = None,
        layers: tuple[int, int] | None = None,
        dropout_rng: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        """Layers `start..stop-1` (default all) from `stem.hidden`, the input of layer `start`.

        Returns:
          `(hidden state after layer stop - 1 [B, T, D], attention probabilities of each layer
          run [B, N_l, T, S])`.
        """
        encoder = self._single_encoder("encode")
        if head_mask is not None:
            check_head_mask(head_mask, encoder)
        return self._stage("encode", params, dropout_rng, stem, head_mask, layers=layers)

    def head(
        self, params: Params, hidden: jax.Array, dropout_rng: jax.Array | None = None
    ) -> ModelOutput:
        """Final norms, pooling and classifier on the last layer's output `[B, T, D]`."""
        self._single_encoder("head")
        return self._stage("head", params, dropout_rng, hidden)

    def _single_encoder(self, stage: str) -> EncoderConfig:
        try:
            return encoder_of(self.config)
        except TypeError:
            raise TypeError(
                f"{stage}: stages exist for BERT, ViT and CLIP vision-tower models, not "
                f"{type(self.config).__name__} (a CLIP model: take a tower with vision_tower)"
            ) from None

    def _stage(self, name: str, params: Params, dropout_rng: jax.Array | None, *args, **kwargs):
        rngs = None if dropout_rng is None else {"dropout": dropout_rng}
        module = self.module
        if not isinstance(self.config, CLIPVisionTowerConfig):  # the tower has no dropout
            kwargs["deterministic"] = dropout_rng is None
        method = getattr(type(module), name)
        return module.apply({"params": params}, *args, method=method, rngs=rngs, **kwargs)


def with_classifier(model: Model, num_labels: int, rng: jax.Array) -> Model:
    """The model with a freshly initialised `num_labels`-way classifier, replacing any it had.

    BERT/ViT: a dense layer initialised as `transformers` does (normal(0.02) kernel, zero bias);
    for BERT it reads the tanh pooler, which must exist. CLIP vision tower: a zero-shot head of
    random class embeddings `[C, E]` (normal(0.02)) and CLIP's initial logit scale; replace
    `class_embeds` with prompt embeddings to classify zero-shot.
    """
    config = model.config
    if isinstance(config, BertConfig) and not config.pooler:
        raise ValueError("a BERT sequence classifier reads the pooler, which this model lacks")
    if isinstance(config, BertConfig | ViTConfig):
        width = config.encoder.width
        kernel = 0.02 * jax.random.normal(rng, (width, num_labels), jnp.float32)
        head = {"classifier": {"kernel": kernel, "bias": jnp.zeros(num_labels)}}
    elif isinstance(config, CLIPVisionTowerConfig):
        E = config.projection_dim
        head = {
            "class_embeds": 0.02 * jax.random.normal(rng, (num_labels, E), jnp.float32),
            "logit_scale": jnp.asarray(LOGIT_SCALE_INIT, jnp.float32),
        }
    else:
        raise TypeError(
            f"with_classifier takes BERT, ViT or CLIP vision-tower models, not "
            f"{type(config).__name__}"
        )
    return Model(dataclasses.replace(config, num_labels=num_labels), {**model.params, **head})


def vision_tower(model: Model) -> Model:
    """The vision tower of a CLIP model as a model of its own (shared weights, no copy)."""
    if not isinstance(model.config, CLIPConfig):
        raise TypeError(f"vision_tower takes a CLIP model, not {type(model.config).__name__}")
    config = CLIPVisionTowerConfig(model.config.vision, model.config.projection_dim)
    return Model(config, model.params["vision"])


def dummy_inputs(config: ArchConfig) -> Mapping[str, jax.Array]:
    """The smallest batch that initialises every weight of `config`'s architecture."""

    def image(image_size: int, num_channels: int) -> jax.Array:
        return jnp.zeros((1, num_channels, image_size, image_size), jnp.float32)

    if isinstance(config, BertConfig):
        return {"input_ids": jnp.zeros((1, 1), jnp.int32)}
    if isinstance(config, ViTConfig):
        return {"pixel_values": image(config.image_size, config.num_channels)}
    if isinstance(config, CLIPVisionTowerConfig):
        return {"pixel_values": image(config.vision.image_size, config.vision.num_channels)}
    return {
        "input_ids": jnp.zeros((1, 1), jnp.int32),
        "pixel_values": image(config.vision.image_size, config.vision.num_channels),
    }
