"""`Model`: a config, a plain pytree of weights and a pure `apply`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hydra_jax import checks
from hydra_jax.models import fused
from hydra_jax.models.bert import Bert
from hydra_jax.models.clip import CLIP, LOGIT_SCALE_INIT, CLIPVision
from hydra_jax.models.config import (
    ArchConfig,
    BertConfig,
    CLIPConfig,
    CLIPVisionTowerConfig,
    DualEncoderConfig,
    EncoderConfig,
    HydraConfig,
    ViTConfig,
    with_compute_dtype,
)
from hydra_jax.models.dual_encoder import DualEncoder
from hydra_jax.models.inputs import (
    PASSIVE_INPUTS,
    check_head_mask,
    check_inputs,
    encoder_of,
    head_mask_encoders,
    input_names,
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
    if isinstance(config, DualEncoderConfig):
        return DualEncoder(config)
    raise TypeError(f"no module for {type(config).__name__}")


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
        allowed = (*input_names(self.config), *masks, *PASSIVE_INPUTS)
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
        kwargs = {k: v for k, v in inputs.items() if k not in PASSIVE_INPUTS and v is not None}
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
        method = getattr(type(module), name)
        return module.apply({"params": params}, *args, method=method, rngs=rngs,
                            deterministic=dropout_rng is None, **kwargs)  # fmt: skip


def with_classifier(model: Model, num_labels: int, rng: jax.Array) -> Model:
    """The model with a freshly initialised `num_labels`-way classifier, replacing any it had.

    BERT/ViT: a dense layer initialised as `transformers` does (normal(0.02) kernel, zero bias);
    for BERT it reads the tanh pooler, which must exist; RoBERTa, ELECTRA and DistilBERT get
    their own two-layer head (`pre_classifier`, then `classifier`), DeiT with its teacher's head
    a `distillation_classifier` too, DINOv2 a classifier on `[CLS, mean patch]` (2D inputs),
    all initialised the same way.
    Vision towers (CLIP's, or a dual
    encoder's ViT with `projection_dim`): a zero-shot head of random class embeddings `[C, E]`
    (normal(0.02)) and CLIP's initial logit scale; `zero_shot` puts prompt embeddings there.
    """
    checks.count("num_labels", num_labels)
    config = model.config
    two_layers = isinstance(config, BertConfig) and config.variant.head != "pooler"
    if isinstance(config, BertConfig) and not (config.pooler or two_layers):
        raise ValueError("a BERT sequence classifier reads the pooler, which this model lacks")
    zero_shot_vit = isinstance(config, ViTConfig) and config.projection_dim > 0
    old_head = ("pre_classifier", "classifier", "distillation_classifier", "class_embeds",
                "logit_scale")  # fmt: skip
    params = {k: v for k, v in model.params.items() if k not in old_head}
    if isinstance(config, BertConfig | ViTConfig) and not zero_shot_vit:
        width = config.encoder.width

        def dense(key: jax.Array, outputs: int, inputs: int = width) -> dict[str, jax.Array]:
            kernel = 0.02 * jax.random.normal(key, (inputs, outputs), jnp.float32)
            return {"kernel": kernel, "bias": jnp.zeros(outputs)}

        dinov2 = isinstance(config, ViTConfig) and config.model_type == "dinov2"
        head = {"classifier": dense(rng, num_labels, 2 * width if dinov2 else width)}
        if two_layers:
            head["pre_classifier"] = dense(jax.random.fold_in(rng, 1), width)
        if isinstance(config, ViTConfig) and config.distilled_head:
            head["distillation_classifier"] = dense(jax.random.fold_in(rng, 2), num_labels)
    elif isinstance(config, CLIPVisionTowerConfig) or zero_shot_vit:
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
    return Model(dataclasses.replace(config, num_labels=num_labels), {**params, **head})


def with_dtype(model: Model, dtype: str) -> Model:
    """The model computing in `dtype` ("float32" or "bfloat16"), with the same weights.

    Parameters keep their dtype (float32 master weights: gradients and optimizer updates stay
    float32); matmuls and hidden states run in `dtype`; attention softmax, LayerNorm statistics,
    logits and embeddings stay float32, and so do the losses computed from them.
    """
    return Model(with_compute_dtype(model.config, dtype), model.params)


def vision_tower(model: Model) -> Model:
    """The vision tower of a CLIP model or a dual encoder as a model of its own: `embeds` are
    the projected image embeddings (before normalisation); shared weights, no copy."""
    config = model.config
    if isinstance(config, CLIPConfig):
        tower = CLIPVisionTowerConfig(config.vision, config.projection_dim)
        return Model(tower, model.params["vision"])
    if isinstance(config, DualEncoderConfig):
        vit = dataclasses.replace(config.vision, num_labels=0, projection_dim=config.projection_dim)
        params = {**model.params["vision_model"], "projection": model.params["visual_projection"]}
        return Model(vit, params)
    raise TypeError(
        f"vision_tower takes a CLIP model or a dual encoder, not {type(config).__name__}"
    )


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
