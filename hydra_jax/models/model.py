"""`Model`: a config, a plain pytree of weights and a pure `apply`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hydra_jax.models.bert import Bert
from hydra_jax.models.clip import CLIP
from hydra_jax.models.config import (
    ArchConfig,
    BertConfig,
    CLIPConfig,
    EncoderConfig,
    HydraConfig,
    ViTConfig,
)
from hydra_jax.models.hydra import Hydra
from hydra_jax.models.outputs import CLIPOutput, ModelOutput
from hydra_jax.models.vit import ViT

Params = Any  # a nested dict of arrays

_MODULES: dict[type, type[nn.Module]] = {
    BertConfig: Bert,
    ViTConfig: ViT,
    CLIPConfig: CLIP,
    HydraConfig: Hydra,
}

# Batch keys each architecture reads; `labels` may ride along in a batch and is ignored here.
_INPUTS: dict[type, tuple[str, ...]] = {
    BertConfig: ("input_ids", "attention_mask", "token_type_ids"),
    ViTConfig: ("pixel_values",),
    CLIPConfig: ("input_ids", "attention_mask", "pixel_values"),
    HydraConfig: ("input_ids", "attention_mask", "token_type_ids"),
}
_PASSIVE_INPUTS = ("labels",)


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


def check_batch(inputs: Mapping[str, Any]) -> None:
    """Refuses an empty batch or an example with no real token (values checked outside `jit`)."""
    for name in ("input_ids", "pixel_values"):
        if inputs.get(name) is not None and np.shape(inputs[name])[0] == 0:
            raise ValueError(f"empty batch: {name} has shape {np.shape(inputs[name])}")
    mask = inputs.get("attention_mask")
    if mask is None or isinstance(mask, jax.core.Tracer):
        return
    empty = np.nonzero(np.asarray(mask).sum(-1) == 0)[0]
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
        return _MODULES[type(self.config)](self.config)

    @classmethod
    def init(cls, config: ArchConfig, rng: jax.Array) -> Model:
        """Randomly initialised weights (tests, training from scratch)."""
        module = _MODULES[type(config)](config)
        params = module.init(rng, **dummy_inputs(config))["params"]
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
          ValueError: a head mask of the wrong shape; an empty batch or an all-padding example.
        """
        masks = head_mask_encoders(self.config)
        allowed = (*_INPUTS[type(self.config)], *masks, *_PASSIVE_INPUTS)
        unknown = sorted(set(inputs) - set(allowed))
        if unknown:
            raise TypeError(
                f"{type(self.config).__name__} model got unexpected inputs {unknown}; "
                f"it takes {list(allowed)}"
            )
        for name, encoder in masks.items():
            if inputs.get(name) is not None:
                check_head_mask(inputs[name], encoder, name)
        check_batch(inputs)
        kwargs = {k: v for k, v in inputs.items() if k not in _PASSIVE_INPUTS and v is not None}
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


def with_classifier(model: Model, num_labels: int, rng: jax.Array) -> Model:
    """A BERT/ViT model with a freshly initialised `num_labels`-way classifier.

    Initialised as `transformers` does (normal(0.02) kernel, zero bias), replacing any classifier
    the model had. For BERT the classifier reads the tanh pooler, which must exist.
    """
    config = model.config
    if not isinstance(config, BertConfig | ViTConfig):
        raise TypeError(f"with_classifier takes BERT or ViT models, not {type(config).__name__}")
    if isinstance(config, BertConfig) and not config.pooler:
        raise ValueError("a BERT sequence classifier reads the pooler, which this model lacks")
    width = config.encoder.width
    kernel = 0.02 * jax.random.normal(rng, (width, num_labels), jnp.float32)
    params = {**model.params, "classifier": {"kernel": kernel, "bias": jnp.zeros(num_labels)}}
    return Model(dataclasses.replace(config, num_labels=num_labels), params)


def dummy_inputs(config: ArchConfig) -> Mapping[str, jax.Array]:
    """The smallest batch that initialises every weight of `config`'s architecture."""

    def image(image_size: int, num_channels: int) -> jax.Array:
        return jnp.zeros((1, num_channels, image_size, image_size), jnp.float32)

    if isinstance(config, BertConfig | HydraConfig):
        return {"input_ids": jnp.zeros((1, 1), jnp.int32)}
    if isinstance(config, ViTConfig):
        return {"pixel_values": image(config.image_size, config.num_channels)}
    return {
        "input_ids": jnp.zeros((1, 1), jnp.int32),
        "pixel_values": image(config.vision.image_size, config.vision.num_channels),
    }
