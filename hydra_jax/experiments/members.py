"""What every study that trains members shares: training seeds, the data each head-set strategy
reads, member fine-tuning with compiled steps shared across members, fusion, and the efficient
ensembles (BatchEnsemble, LoRA-Ensemble) built and fine-tuned from one model.

The strategies themselves live in `hydra_jax.ensembles` (`head_sets`, explicit arguments); this
module draws their data from a study's sets and settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from hydra_jax import ensembles
from hydra_jax.convert.native import CONFIG_FILE, load_model, save_model
from hydra_jax.data import Dataset, labelled_batches, subset, uncertainty_batches
from hydra_jax.experiments import single_pass
from hydra_jax.experiments.artefacts import hf_dir
from hydra_jax.experiments.workdir import Workdir
from hydra_jax.heads import UncertaintyBatches
from hydra_jax.models import Model
from hydra_jax.training import (
    Loss,
    TrainSettings,
    fit,
    make_optimizer,
    make_train_step,
    schedule_length,
)


def training_seed(config: ml_collections.ConfigDict, member: int) -> int:
    """Member `member`'s seed in study `config.seed` (0 when absent): studies share no model."""
    return 1000 * config.get("seed", 0) + member


def member_seeds(study: ml_collections.ConfigDict, num_members: int) -> list[int]:
    return [training_seed(study, m) for m in range(num_members)]


def uncertainty_sets(
    id_val: Dataset, ood_val: Dataset, examples: int, seeds: Sequence[int], batch_size: int
) -> list[UncertaintyBatches]:
    """Per seed: `examples` / 2 ID and as many OOD validation examples, drawn with that seed."""
    half = examples // 2
    return [
        uncertainty_batches(subset(id_val, half, seed), subset(ood_val, half, seed), batch_size)
        for seed in seeds
    ]


def hies_alphas(config: ml_collections.ConfigDict, num_members: int) -> tuple[float, ...]:
    """HIES's alpha of each of `num_members` members: `config.hies_alphas`, or where it is empty
    evenly spaced in (0, 1), member m's (m + 1) / (M + 1) (0.25, 0.5, 0.75 for 3)."""
    given = tuple(config.get("hies_alphas", ()))
    return given or tuple((m + 1) / (num_members + 1) for m in range(num_members))


def head_sets(
    config: ml_collections.ConfigDict,
    strategy: str,
    single: Model,
    calibration_set: Dataset,
    seeds: Sequence[int],
    validation: Callable[[], tuple[Dataset, Dataset]] | None = None,
    num_members: int | None = None,
) -> np.ndarray:
    """Member head sets `[M, L, N]` of `strategy` (`ensembles.head_sets`), its data drawn as the
    config's `calibration_size`, `circuit.examples`, `hies_alphas` and `circuit.objectives` say:
    member m's calibration examples from `calibration_set` and its circuit-search examples from
    `validation()` (ID, pooled OOD), each with `seeds[m]`."""
    M = config.num_members if num_members is None else num_members
    size = config.eval.batch_size
    calibration, uncertainty = [], []
    if ensembles.STRATEGIES.get(strategy) == "calibration":
        calibration = [
            labelled_batches(calibration_set, config.calibration_size, s, size) for s in seeds[:M]
        ]
    elif strategy == "circuit":
        if validation is None:
            raise ValueError("the circuit strategy needs ID and OOD validation sets")
        id_val, ood_val = validation()
        uncertainty = uncertainty_sets(id_val, ood_val, config.circuit.examples, seeds[:M], size)
    return ensembles.head_sets(
        strategy,
        single,
        M,
        calibration=calibration,
        uncertainty=uncertainty,
        alphas=hies_alphas(config, M),
        objectives=config.get("circuit", {}).get("objectives", ()),
    )


def fit_classifiers(
    workdir: Workdir,
    train: Dataset,
    settings: TrainSettings,
    seeds: Sequence[int],
    initial: Callable[[int], Model],
    publish: Callable[[Model, Path], None],
) -> list[Model]:
    """Member m: `initial(seeds[m])` fine-tuned on `train` under `settings` with that seed
    (resuming in `members/member_m`), then `publish(model, hf/member_m)`. One compiled step
    serves every member; a member an earlier run published keeps that run's time."""
    models, step_fn = [], None
    for m, seed in enumerate(seeds):
        model = initial(seed)
        if step_fn is None:
            total = schedule_length(len(train), settings)[1]
            step_fn = make_train_step(model, make_optimizer(settings, total))
        path = hf_dir(workdir.path, m)
        published = (path / "config.json").is_file()  # finished before
        with workdir.stage(f"train member {m} (seed {seed})", record=not published):
            member_settings = dataclasses.replace(settings, seed=seed)
            directory = workdir.at("member_training", m=m)
            model = fit(model, train, member_settings, directory, step_fn=step_fn)
            publish(model, path)
        models.append(model)
    return models


def shared_step(steps: dict[Any, Any], model: Model, train_size: int, settings: TrainSettings):
    """`model`'s compiled train step under `settings`, compiled once per architecture and
    settings in `steps` (the seed aside: it enters only through the step's key)."""
    key = (model.config, dataclasses.replace(settings, seed=0))
    if key not in steps:
        total = schedule_length(train_size, settings)[1]
        steps[key] = make_train_step(model, make_optimizer(settings, total))
    return steps[key]


def fine_tuned_members(
    single: Model,
    sets: np.ndarray,
    train: Dataset,
    settings: TrainSettings,
    seeds: Sequence[int],
    directory: Path,
    steps: dict[Any, Any] | None = None,
) -> list[Model]:
    """`single` compacted to each head set `[M, L, N]`, member m fine-tuned (resuming) under
    `directory/member_m` with training seed `seeds[m]` (none if 0 epochs).

    `steps` caches compiled train steps across calls (`shared_step`).
    """
    members, steps = [], {} if steps is None else steps
    for m, member in enumerate(ensembles.members_from(single, sets)):
        if settings.epochs > 0:
            step_fn = shared_step(steps, member, len(train), settings)  # members of one shape
            member_settings = dataclasses.replace(settings, seed=seeds[m])
            member = fit(member, train, member_settings, directory / f"member_{m}", step_fn=step_fn)
        members.append(member)
    return members


def efficient_settings(config: ml_collections.ConfigDict, kind: str) -> TrainSettings:
    """`config.train` with the ensemble's own overrides (`config.KIND.train`)."""
    return TrainSettings(**{**config.train.to_dict(), **config[kind].train.to_dict()})


def efficient_ensemble(
    config: ml_collections.ConfigDict, kind: str, model: Model, seed: int, fresh_heads: int
) -> Model:
    """`config.ensemble_size` members of the single-pass ensemble `kind` from `model` (a
    classifier), initialised with `seed`, as its kind builds them from `config[kind]`
    (`single_pass.METHODS`): a LoRA-Ensemble gets `fresh_heads`-way member heads, one draw
    each (0: copies of `model`'s own fine-tuned head); a Packed-Ensemble and MIMO take only
    `model`'s architecture."""
    build = single_pass.METHODS[kind].build
    key = jax.random.key(seed)
    return build(model, config.ensemble_size, key, config[kind], fresh_heads or None)


def efficient_loss(config: ml_collections.ConfigDict, kind: str, ensemble: Model) -> Loss | None:
    """The training objective of `kind` from `config[kind]` (MIMO's: each member its own
    images), or None: every member learns the labels of the batch."""
    loss = single_pass.METHODS[kind].loss
    return None if loss is None else loss(ensemble, config[kind])


def fit_efficient(
    workdir: Workdir,
    kind: str,
    ensemble: Model,
    train: Dataset,
    settings: TrainSettings,
    loss: Loss | None = None,
) -> Model:
    """`ensemble` trained on `train` with `loss` (resuming in `efficient_training/KIND`; a
    LoRA-Ensemble's backbone frozen) and saved to `efficient/KIND`; one an earlier run saved is
    loaded and keeps that run's time."""
    path = workdir.at("efficient", kind=kind)
    done = (path / CONFIG_FILE).is_file()
    with workdir.stage(f"train {kind}", record=not done):
        if done:
            return load_model(path)
        directory = workdir.at("efficient_training", kind=kind)
        ensemble = fit(
            ensemble, train, settings, directory, loss=loss, trainable=ensembles.trainable(ensemble)
        )
        save_model(ensemble, path)
    return ensemble
