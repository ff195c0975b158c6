"""The efficient ensembles the Hydra paper compares with.

    be = hj.ensembles.batch_ensemble(model, 3, key)          # BatchEnsemble
    lora = hj.ensembles.lora_ensemble(model, 3, key, rank=8)  # LoRA-Ensemble
    lora = fit(lora, train, settings, workdir, trainable=hj.ensembles.trainable(lora))
    lora(**batch).logits                                      # [B, M, C], one forward pass
    packed = hj.ensembles.packed_ensemble(model.config, 4, key, alpha=2, groups=2)
    mimo = hj.ensembles.mimo(vit.config, 3, key)              # MIMO, an image classifier
    mimo = fit(mimo, train, settings, workdir, loss=mimo_loss(mimo))  # hydra_jax.training

Each returns a `Model` whose `apply` runs every member in one pass and gives `[B, M, C]` member
logits, as a fused Hydra does, so training (`fit`: every member learns the labels), prediction,
metrics, costs and `save_model` / `load_model` treat it like any model. BatchEnsemble and
LoRA-Ensemble transform a model of any single-encoder family with a classifier
(`with_classifier`); a Packed-Ensemble and MIMO take only an architecture and train from
scratch (MIMO: an image classifier, trained with `hydra_jax.training.mimo_loss`). How they compute:
`hydra_jax.models.efficient`, `hydra_jax.models.packed` and `hydra_jax.models.mimo`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from hydra_jax import checks
from hydra_jax.models import (
    BatchEnsembleConfig,
    LoraEnsembleConfig,
    MemberConfig,
    MimoConfig,
    Model,
    PackedEnsembleConfig,
    kinds,
    member_of,
    with_classifier,
)
from hydra_jax.models import efficient as _efficient
from hydra_jax.models import packed as _packed
from hydra_jax.models.architectures import CLASSIFIER_PARAMS
from hydra_jax.models.efficient import LORA_TARGETS


def _check_member(model: Model, what: str) -> None:
    if member_of(model.config) is not None:
        raise TypeError(f"{what} takes one model, not a {type(model.config).__name__}")
    if not any(k in model.params for k in CLASSIFIER_PARAMS):
        raise ValueError(f"{what}: the model has no classifier; add one with with_classifier")


def batch_ensemble(
    model: Model, num_members: int, rng: jax.Array, factor_std: float = 0.5
) -> Model:
    """A BatchEnsemble of `num_members` members (Wen et al., ICLR 2020) from `model`.

    Every dense layer keeps `model`'s kernel, shared, and gets per-member rank-1 factors
    (N(1, `factor_std`), as torch-uncertainty initialises them) and per-member biases (`model`'s
    to start). Fine-tune factors and shared weights together (`fit`). With `factor_std=0`
    every member computes `model`'s function.
    """
    _check_member(model, "batch_ensemble")
    config = BatchEnsembleConfig(
        model.config, checks.count("num_members", num_members), float(factor_std)
    )
    return Model(config, _efficient.init_params(config, model.params, rng))


def lora_ensemble(
    model: Model,
    num_members: int,
    rng: jax.Array,
    rank: int = 8,
    alpha: float = 16.0,
    targets: tuple[str, ...] = LORA_TARGETS,
    num_labels: int | None = None,
) -> Model:
    """A LoRA-Ensemble of `num_members` members (Muhlematter et al., 2024) on `model`.

    Member m adds a rank-`rank` adapter `(alpha / rank) x A_m B_m` to each attention projection
    in `targets` and has its own classifier head: a copy of `model`'s, or, with `num_labels`, a
    fresh `num_labels`-way head per member (`with_classifier`, each its own key). `B` starts at
    zero, so each member starts as `model` with its head. Train only the adapters and heads:
    `fit(..., trainable=trainable(ensemble))`.
    """
    _check_member(model, "lora_ensemble")
    M = checks.count("num_members", num_members)
    config = LoraEnsembleConfig(
        model.config, M, checks.count("rank", rank), float(alpha), tuple(targets)
    )
    adapter_key, head_key = jax.random.split(rng)
    heads = None
    if num_labels is not None:
        fresh = [with_classifier(model, num_labels, k) for k in jax.random.split(head_key, M)]
        heads = [{k: v for k, v in m.params.items() if k in CLASSIFIER_PARAMS} for m in fresh]
        config = LoraEnsembleConfig(fresh[0].config, M, config.rank, config.alpha, config.targets)
        model = fresh[0]
    return Model(config, _efficient.init_params(config, model.params, adapter_key, heads))


def packed_ensemble(
    config: MemberConfig, num_members: int, rng: jax.Array, alpha: float = 2.0, groups: int = 1
) -> Model:
    """A Packed-Ensemble (Laurent et al., ICLR 2023) of `num_members` members of the
    architecture `config` (a checkpoint's `model.config`, or a preset), randomly initialised.

    Member width `alpha D / M`, `groups` (gamma) x the heads, encoder dense layers grouped into
    `groups` blocks (`hydra_jax.models.packed`). It cannot start from pretrained weights: train
    it from scratch with `fit`. `alpha=1, groups=1, num_members=1` is `config`'s own model.
    """
    if member_of(config) is not None:
        raise TypeError(f"packed_ensemble takes one architecture, not {type(config).__name__}")
    M, G = checks.count("num_members", num_members), checks.count("groups", groups)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    member = _packed.packed_member(config, M, float(alpha), G)
    return Model.init(PackedEnsembleConfig(member, M, G), rng)


def mimo(config: MemberConfig, num_members: int, rng: jax.Array) -> Model:
    """A MIMO ensemble (Havasi et al., ICLR 2021) of `num_members` members of the image
    classifier architecture `config` (a ViT, DeiT or DINOv2 `model.config`), randomly
    initialised: one network with M x the input channels and classes
    (`hydra_jax.models.mimo`). Train it from scratch with `fit(..., loss=mimo_loss(model))`
    (`hydra_jax.training`).
    `num_members=1` is `config`'s own model.
    """
    if member_of(config) is not None:
        raise TypeError(f"mimo takes one architecture, not {type(config).__name__}")
    return Model.init(MimoConfig(config, checks.count("num_members", num_members)), rng)


def trainable(model: Model) -> Callable[[tuple[str, ...]], bool]:
    """The `fit(trainable=...)` predicate of an efficient ensemble (its kind's,
    `hydra_jax.models.kinds`): every weight of a BatchEnsemble, a Packed-Ensemble or MIMO, only
    the adapters and member heads of a LoRA-Ensemble."""
    kind = kinds.kind_of(model.config)
    if kind is None:
        names = ", ".join(k.name for k in kinds.KINDS.values())
        raise TypeError(f"trainable takes an ensemble ({names}), not {type(model.config).__name__}")
    return kind.trainable(model.config)


def parameter_count(model: Model, member: Model | None = None) -> int:
    """The weight count of an efficient ensemble `model` by its kind's formula: a BatchEnsemble
    or LoRA-Ensemble from the model `member` it was built from
    (`hydra_jax.models.efficient.parameter_count`); a Packed-Ensemble from its member
    architecture, M dense members less the off-diagonal blocks of each grouped layer; MIMO from
    its member architecture, one model with M - 1 more patch kernels and classifiers."""
    config = model.config
    kind = kinds.kind_of(config)
    if kind is None or kind.parameter_count is None:
        raise TypeError(f"no weight-count formula for {type(config).__name__}")
    if member is None:  # one member's weight shapes, none of them computed
        init = lambda key: Model.init(config.member, key).params  # noqa: E731
        return kind.parameter_count(config, jax.eval_shape(init, jax.random.key(0)))
    return kind.parameter_count(config, member.params)


# The study's builders (`hydra_jax.experiments.single_pass`): the ensemble of `num_members` from a
# study's starting `model`, its settings `config[KIND]`.


def batch_ensemble_from(
    model: Model, num_members: int, rng: jax.Array, settings: Any, num_labels: int | None
) -> Model:
    del num_labels  # the members start with `model`'s classifier
    return batch_ensemble(model, num_members, rng, settings["factor_std"])


def lora_ensemble_from(
    model: Model, num_members: int, rng: jax.Array, settings: Any, num_labels: int | None
) -> Model:
    targets = tuple(checks.split_names(settings["targets"]))
    return lora_ensemble(
        model, num_members, rng, settings["rank"], settings["alpha"], targets, num_labels
    )


def packed_ensemble_from(
    model: Model, num_members: int, rng: jax.Array, settings: Any, num_labels: int | None
) -> Model:
    del num_labels  # the architecture's own classes
    return packed_ensemble(model.config, num_members, rng, settings["alpha"], settings["groups"])


def mimo_from(
    model: Model, num_members: int, rng: jax.Array, settings: Any, num_labels: int | None
) -> Model:
    del settings, num_labels  # its settings are its training objective's (`mimo_loss_from`)
    return mimo(model.config, num_members, rng)
