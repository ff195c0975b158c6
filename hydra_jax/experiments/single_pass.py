"""The single-pass ensembles a study trains as methods of their own, one entry per method.

The model layer's kind table (`hydra_jax.models.kinds`) says how a kind initialises, runs,
trains and counts its weights; this table says what a study does with it: how it builds the
ensemble from the study's starting model, which objective trains it, which settings it refuses
before anything trains, and where it starts when the study trains its members from scratch.
The method's settings are `config[NAME]`. A new method is one entry, added with `register`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from hydra_jax.ensembles import efficient
from hydra_jax.models import Model, mimo, packed
from hydra_jax.models.efficient import BatchEnsembleConfig, LoraEnsembleConfig
from hydra_jax.models.mimo import MimoConfig
from hydra_jax.models.packed import PackedEnsembleConfig
from hydra_jax.training import Loss, mimo_loss_from

Build = Callable[[Model, int, jax.Array, Any, "int | None"], Model]


@dataclasses.dataclass(frozen=True)
class SinglePass:
    """One study method's entry.

    Attributes:
      config_class: the ensemble's config class (a kind of `hydra_jax.models.kinds`).
      build: `(model, num_members, rng, settings, num_labels) -> ensemble` from the study's
        starting `model`; `settings` is `config[NAME]`, `num_labels` the classes of fresh member
        heads or None for the model's own.
      loss: `(ensemble, settings) -> Loss`, its training objective; None: every member learns
        the batch's labels.
      check: `(architecture, num_members, settings)`, raising `TypeError` / `ValueError` for
        settings the architecture cannot take.
      frozen_backbone: it adapts a frozen model, so where a study trains its members from
        scratch it starts from the trained member 0.
    """

    config_class: type
    build: Build
    loss: Callable[[Model, Any], Loss] | None = None
    check: Callable[[Any, int, Any], None] | None = None
    frozen_backbone: bool = False


def _check_packed(architecture: Any, num_members: int, settings: Any) -> None:
    packed.packed_member(architecture, num_members, settings["alpha"], settings["groups"])


def _check_mimo(architecture: Any, num_members: int, settings: Any) -> None:
    mimo.check_settings(settings["repetitions"], settings["input_repetition"], "mimo.")
    MimoConfig(architecture, num_members)


METHODS: dict[str, SinglePass] = {
    "batch_ensemble": SinglePass(BatchEnsembleConfig, efficient.batch_ensemble_from),
    "lora_ensemble": SinglePass(
        LoraEnsembleConfig, efficient.lora_ensemble_from, frozen_backbone=True
    ),
    "packed_ensemble": SinglePass(
        PackedEnsembleConfig, efficient.packed_ensemble_from, check=_check_packed
    ),
    "mimo": SinglePass(MimoConfig, efficient.mimo_from, mimo_loss_from, _check_mimo),
}


def register(name: str, entry: SinglePass) -> None:
    """Adds the study method `name` (its settings: `config[name]`)."""
    if name in METHODS:
        raise ValueError(f"the single-pass method {name!r} already exists")
    METHODS[name] = entry
