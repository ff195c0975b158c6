"""`Model`: a config, a plain pytree of weights and a pure `apply`."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax

from hydra_jax import checks
from hydra_jax.models import kinds
from hydra_jax.models.architectures import (
    CLASSIFIER_PARAMS,
    PASSIVE_INPUTS,
    architecture,
    check_inputs,
    dummy_inputs,
    encoder_of,
    head_mask_encoders,
    input_names,
    module_of,
)
from hydra_jax.models.config import EncoderConfig, member_of, with_compute_dtype, with_encoders
from hydra_jax.models.inputs import check_head_mask
from hydra_jax.models.kinds import ArchConfig
from hydra_jax.models.outputs import CLIPOutput, ModelOutput, Stem

Params = Any  # a nested dict of arrays


@dataclasses.dataclass(frozen=True)
class Model:
    """A transformer as a config, a weight pytree and a pure `apply`.

    `apply(params, **inputs)` is a pure function of arrays, safe under `jit`, `grad` and `vmap`;
    `model(**inputs)` is the same with `model.params`. Called on concrete arrays it runs as one
    compiled program per config and input shapes; under a caller's transformation it is traced
    into the caller's program.
    """

    config: ArchConfig
    params: Params

    @property
    def module(self) -> nn.Module:
        return module_of(self.config)

    @classmethod
    def init(cls, config: ArchConfig, rng: jax.Array) -> Model:
        """Randomly initialised weights (tests, training from scratch).

        An ensemble as its kind initialises it (`hydra_jax.models.kinds`): a fused Hydra as the
        fusion of M independently initialised members, a BatchEnsemble or LoRA-Ensemble as the
        transform of one, ...
        """
        kind = kinds.kind_of(config)
        if kind is not None:
            return cls(config, kind.init(config, rng, lambda c, k: cls.init(c, k).params))
        # Only the initialisers run: the dummy batch's forward pass is traced for the weights'
        # shapes, not computed (run eagerly, each of its operations would compile on its own).
        shapes = jax.eval_shape(lambda: dummy_inputs(config))
        return cls(config, module_of(config).lazy_init(rng, **shapes)["params"])

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
        if output_attentions and kinds.kind_of(self.config) is not None:
            raise NotImplementedError(
                f"a {type(self.config).__name__} model does not return attention maps"
            )
        traced = any(
            isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((params, kwargs, dropout_rng))
        )
        run = _forward if traced or _intercepted() else _compiled_forward
        return run(self.config, params, kwargs, dropout_rng, output_attentions)

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
        self,
        params: Params,
        hidden: jax.Array,
        dropout_rng: jax.Array | None = None,
        key_mask: jax.Array | None = None,
    ) -> ModelOutput:
        """Final norms, pooling and classifier on the last layer's output `[B, T, D]`;
        `key_mask` `[B, S]` (the stem's) for a head that pools over real tokens."""
        self._single_encoder("head")
        return self._stage("head", params, dropout_rng, hidden, key_mask=key_mask)

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
        return module.apply(
            {"params": params},
            *args,
            method=method,
            rngs=rngs,
            deterministic=dropout_rng is None,
            **kwargs,
        )


def _forward(
    config: ArchConfig,
    params: Params,
    inputs: dict[str, Any],
    dropout_rng: jax.Array | None,
    output_attentions: bool,
) -> ModelOutput | CLIPOutput:
    """`Model.apply` after its checks."""
    kind = kinds.kind_of(config)
    if kind is not None:
        return kind.apply(config, params, inputs, dropout_rng)
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return module_of(config).apply(
        {"params": params},
        **inputs,
        output_attentions=output_attentions,
        deterministic=dropout_rng is None,
        rngs=rngs,
    )


# `Model.apply` on concrete arrays (a notebook, a script, a test): one program per config and
# input shapes, where run operation by operation each of hundreds of operations would compile on
# its own. Called with tracers (under a caller's `jit`, `grad` or `vmap`) the forward pass is
# traced into the caller's program as it is, so what a trace context decides there (the mesh
# axis `member_vmap` maps) is never served from a program traced outside it.
_compiled_forward = jax.jit(_forward, static_argnames=("config", "output_attentions"))


def _intercepted() -> bool:
    """Whether a Flax interceptor (`nn.intercept_methods`) is active. It acts while a forward
    pass is traced, so a call under one is traced anew, not served from a compiled program."""
    return bool(getattr(nn.module, "_global_interceptor_stack", None))


def with_classifier(model: Model, num_labels: int, rng: jax.Array) -> Model:
    """The model with a freshly initialised `num_labels`-way classifier, replacing any it had.

    Each family's own head (its `Architecture.head`), initialised as `transformers` does
    (normal(0.02) kernels, zero biases): BERT a dense layer on the tanh pooler, which must exist;
    RoBERTa, ELECTRA, DistilBERT and DeBERTa their two-layer head (`pre_classifier`, then
    `classifier`); ViT a dense layer on CLS, DeiT with its teacher's head a
    `distillation_classifier` too, DINOv2 one on `[CLS, mean patch]`. Vision towers (CLIP's, or
    a dual encoder's ViT with `projection_dim`): a zero-shot head of random class embeddings
    `[C, E]` (normal(0.02)) and CLIP's initial logit scale; `zero_shot` puts prompt embeddings
    there. A CLIP or SigLIP model becomes HF's `CLIPForImageClassification` (its vision tower, a
    dense layer on the mean patch token) or `SiglipForImageClassification` (the vision tower
    without its pooling head, a dense layer on the mean token).
    """
    checks.count("num_labels", num_labels)
    config, params = model.config, model.params
    as_classifier = architecture(config).image_classifier
    if as_classifier is not None and member_of(config) is None:
        config, params = as_classifier(config, params)
    new_head = architecture(config).head
    if new_head is None or member_of(config) is not None:
        raise TypeError(
            f"with_classifier takes BERT-family, ViT-family, CLIP, SigLIP or vision-tower models, "
            f"not {type(config).__name__}"
        )
    head = new_head(config, num_labels, rng)
    params = {k: v for k, v in params.items() if k not in CLASSIFIER_PARAMS}
    return Model(dataclasses.replace(config, num_labels=num_labels), {**params, **head})


def with_dtype(model: Model, dtype: str, hidden: str = "float32") -> Model:
    """The model computing in `dtype` ("float32" or "bfloat16"), with the same weights.

    Parameters keep their dtype (float32 master weights: gradients and optimizer updates stay
    float32). The encoder layers' dense products (attention projections, MLP) take operands in
    `dtype` and accumulate in float32; everything else runs in `hidden`: "float32" (the
    default: hidden states, attention and heads as in a float32 model), or `dtype` itself
    (hidden states and attention products in `dtype` too: half the activation memory, as
    Flax's `dtype=`). Attention softmax, LayerNorm statistics, logits, embeddings and losses
    are float32 either way.

    On a CPU, XLA runs element-wise work in float32 whatever its dtype, converting bfloat16
    operands on each side, so a bfloat16 `hidden` mostly adds conversions there (docs/scale.md
    measures both); bfloat16 products run on the CPU's bfloat16 units where it has them.
    """
    return Model(with_compute_dtype(model.config, dtype, hidden), model.params)


def with_remat(model: Model, remat: bool = True) -> Model:
    """The model rematerialising each encoder layer in its gradients (`EncoderConfig.remat`),
    with the same weights: training keeps each layer's input only and recomputes the rest in
    the backward pass (a fraction of the activation memory for about a third more FLOPs), as a
    batch too large for a chip's memory needs. Outputs and gradients are the same values."""
    return Model(with_encoders(model.config, remat=remat), model.params)


def vision_tower(model: Model) -> Model:
    """The vision tower of a CLIP model or a dual encoder as a model of its own: `embeds` are
    the projected image embeddings (before normalisation); shared weights, no copy."""
    take = architecture(model.config).vision_tower
    if take is None or member_of(model.config) is not None:
        raise TypeError(
            f"vision_tower takes a CLIP model or a dual encoder, not {type(model.config).__name__}"
        )
    return Model(*take(model.config, model.params))
