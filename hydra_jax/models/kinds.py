"""Ensemble kinds: one table entry per kind of model that holds M members in one network.

A kind's config holds its members' architecture as `member` and their count as `num_members`
(`config.member_of`); its entry in `KINDS` says everything the rest of the package asks of it:

- `init(config, rng, init_member)`: random weights (`Model.init`), `init_member(config, rng)`
  drawing one model's weights;
- `apply(config, params, inputs, dropout_rng)`: every member in one pass, outputs with the
  member axis second (`logits` `[B, M, C]`);
- `trainable(config)`: which weights train (a `fit(trainable=...)` predicate);
- `parameter_count(config, member)`: the ensemble's weight count by its formula from one
  member's weights (or their shapes); None: the weights it stores.

What a study does with a kind (how it builds one from a starting model, its training objective)
is the study's own table, `hydra_jax.experiments.single_pass`.

Saving and loading (`hj.save_model`) read the table for the config classes; a fused Hydra and
every kind here have no HF format. A new kind is its own module (its config, init and apply)
and one entry, registered with `register`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from hydra_jax.models import efficient, fused, mimo, packed
from hydra_jax.models.architectures import FamilyConfig, module_of
from hydra_jax.models.config import member_of
from hydra_jax.models.efficient import BatchEnsembleConfig, LoraEnsembleConfig
from hydra_jax.models.fused import HydraConfig
from hydra_jax.models.mimo import MimoConfig
from hydra_jax.models.packed import PackedEnsembleConfig

# A config of several members in one network, and any model's config.
EnsembleConfig = (
    HydraConfig | BatchEnsembleConfig | LoraEnsembleConfig | PackedEnsembleConfig | MimoConfig
)
ArchConfig = FamilyConfig | EnsembleConfig
Params = Any
InitMember = Callable[[Any, jax.Array], Params]


def _every_weight(config: Any) -> Callable[[tuple[str, ...]], bool]:
    del config
    return lambda path: True


@dataclasses.dataclass(frozen=True)
class Kind:
    """One ensemble kind's entry (the module docstring says what each field is)."""

    name: str
    init: Callable[[Any, jax.Array, InitMember], Params]
    apply: Callable[[Any, Params, dict[str, Any], jax.Array | None], Any]
    trainable: Callable[[Any], Callable[[tuple[str, ...]], bool]] = _every_weight
    parameter_count: Callable[[Any, Params], int] | None = None


def _init_hydra(config: HydraConfig, rng: jax.Array, init_member: InitMember) -> Params:
    """The fusion of M independently initialised members."""
    keys = jax.random.split(rng, config.num_members)
    return fused.fuse_params(config.member, [init_member(config.member, k) for k in keys])


def _apply_hydra(config: HydraConfig, params: Params, inputs: dict, rng: jax.Array | None):
    return fused.apply(config, module_of(config.member), params, inputs, rng)


def _init_efficient(config: Any, rng: jax.Array, init_member: InitMember) -> Params:
    """The transform of one initialised member."""
    model_key, adapter_key = jax.random.split(rng)
    return efficient.init_params(config, init_member(config.member, model_key), adapter_key)


def _init_packed(config: PackedEnsembleConfig, rng: jax.Array, init_member: InitMember):
    """Each member as its family initialises a model (grouped layers: the diagonal blocks)."""
    keys = jax.random.split(rng, config.num_members)
    return packed.init_params(config, [init_member(config.member, k) for k in keys])


def _init_mimo(config: MimoConfig, rng: jax.Array, init_member: InitMember) -> Params:
    """One network, M times the channels and classes, as its family initialises it."""
    return init_member(mimo.network(config), rng)


KINDS: dict[type, Kind] = {
    HydraConfig: Kind("hydra", _init_hydra, _apply_hydra),
    BatchEnsembleConfig: Kind(
        "batch_ensemble",
        _init_efficient,
        efficient.apply,
        efficient.trainable,
        efficient.parameter_count,
    ),
    LoraEnsembleConfig: Kind(
        "lora_ensemble",
        _init_efficient,
        efficient.apply,
        efficient.trainable,
        efficient.parameter_count,
    ),
    PackedEnsembleConfig: Kind(
        "packed_ensemble",
        _init_packed,
        packed.apply,
        parameter_count=packed.parameter_count,
    ),
    MimoConfig: Kind(
        "mimo",
        _init_mimo,
        mimo.apply,
        parameter_count=mimo.parameter_count,
    ),
}


def kind_of(config: Any) -> Kind | None:
    """The kind of an ensemble config, or None for one model's config.

    Raises:
      TypeError: a config with members (`member`, `num_members`) of no registered kind.
    """
    kind = KINDS.get(type(config))
    if kind is None and member_of(config) is not None:
        raise TypeError(f"{type(config).__name__} holds members but is no registered kind")
    return kind


def named(name: str) -> Kind:
    """The kind called `name` (`"hydra"`, `"mimo"`, ...)."""
    for kind in KINDS.values():
        if kind.name == name:
            return kind
    raise KeyError(f"no ensemble kind {name!r}; kinds: {[k.name for k in KINDS.values()]}")


def register(config_class: type, kind: Kind) -> None:
    """Adds a kind: its config class (with `member` and `num_members`) and its entry."""
    if config_class in KINDS:
        raise ValueError(f"{config_class.__name__} is already the kind {KINDS[config_class].name}")
    KINDS[config_class] = kind
