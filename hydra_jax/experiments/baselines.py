"""The uncertainty baselines: one classifier trained per seed, evaluated as single / deep
ensemble / MC dropout; and the single-pass ensembles the methods name (`batch_ensemble`,
`lora_ensemble`, `packed_ensemble`), trained after the members.

`train(config, workdir)` trains one classifier per member m (member 0 is `single`; members
0..M-1 are the deep ensemble), with training seed `1000 * config.seed + m`: a pretrained
checkpoint fine-tuned with a new classifier (`config.checkpoint`), or a ViT trained from scratch
(`config.model`). Each finished classifier is published as a HuggingFace directory
`workdir/hf/member_M`, and everything downstream
(`evaluate`, the pruning and Hydra experiments) loads those directories with
`hydra_jax.from_pretrained`, as a user would load a hub checkpoint. A BatchEnsemble and a
Packed-Ensemble start where member 0 starts (the checkpoint with member 0's new classifier, or
member 0's fresh ViT; a Packed-Ensemble takes its architecture only); a LoRA-Ensemble adapts
the checkpoint, or, for a ViT trained from scratch, the trained member 0 (a frozen backbone must
have learnt something), with a fresh head per member. Each is saved to `efficient/KIND`.
`evaluate(config, workdir)`
runs every method of `config.methods` on the ID test set, each OOD test set and each shifted
test set and writes the artefacts of `hydra_jax.evaluation` (`evaluators.evaluate_methods`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import ml_collections

from hydra_jax.convert import from_pretrained
from hydra_jax.data import Dataset
from hydra_jax.experiments import artefacts, methods, study_data
from hydra_jax.experiments.artefacts import hf_dir
from hydra_jax.experiments.evaluators import evaluate_methods
from hydra_jax.experiments.members import (
    EFFICIENT,
    efficient_ensemble,
    efficient_settings,
    fit_classifiers,
    fit_efficient,
    training_seed,
)
from hydra_jax.experiments.workdir import Workdir, WorkdirError
from hydra_jax.models import Model, with_classifier
from hydra_jax.training import TrainSettings


def members(config: ml_collections.ConfigDict) -> list[int]:
    """The member indices a baselines run trains (one unless it has a deep ensemble)."""
    return list(range(config.ensemble_size)) if "deep_ensemble" in config.methods else [0]


def initial_model(config: ml_collections.ConfigDict, seed: int, base: Model | None) -> Model:
    """Seed `seed`'s starting point: a fresh ViT of `config.model`, or `base` (the pretrained
    checkpoint) with a new classifier."""
    if "model" in config:
        return Model.init(artefacts.scratch_config(config), jax.random.key(seed))
    assert base is not None
    return with_classifier(base, study_data.num_classes(config), jax.random.key(seed))


def fit_members(
    config: ml_collections.ConfigDict, workdir: Workdir, base: Model | None, train: Dataset
) -> list[Model]:
    """Trains one classifier per seed (resuming where a run stopped) and publishes each as an
    HF directory; a member trained by an earlier run keeps that run's time."""
    seeds = [training_seed(config, member) for member in members(config)]
    our_pixels = study_data.is_images(config)
    return fit_classifiers(
        workdir, train, TrainSettings(**config.train.to_dict()), seeds,
        initial=lambda seed: initial_model(config, seed, base),
        publish=lambda model, path: artefacts.publish(model, path, our_pixels=our_pixels),
    )  # fmt: skip


def fit_efficient_ensembles(
    config: ml_collections.ConfigDict, workdir: Workdir, single: Model, base: Model | None,
    train: Dataset,
) -> None:  # fmt: skip
    """Trains and saves every single-pass ensemble of `config.methods` (module docstring)."""
    seed = training_seed(config, 0)
    for kind in (n for n in config.methods if n in EFFICIENT):
        start = initial_model(config, seed, base)
        if kind == "lora_ensemble" and base is None:  # from scratch: adapt the trained member 0
            start = single
        fresh = study_data.num_classes(config) if kind == "lora_ensemble" else 0
        ensemble = efficient_ensemble(config, kind, start, seed, fresh)
        settings = dataclasses.replace(efficient_settings(config, kind), seed=seed)
        fit_efficient(workdir, kind, ensemble, train, settings)


def train(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> list[Model]:
    """Trains one classifier per member seed into `workdir`, then the single-pass ensembles the
    methods name (resuming where it stopped)."""
    workdir = Workdir.of(workdir)
    TrainSettings(**config.train.to_dict())  # refuse bad settings before touching the workdir
    methods.check_names(config.methods)  # an unknown method would fail only at evaluation
    for kind in (n for n in config.methods if n in EFFICIENT):
        efficient_settings(config, kind)
    workdir.claim(config)
    base = None if "model" in config else artefacts.base_model(config)
    study = study_data.load_data(config, base)
    models = fit_members(config, workdir, base, study.train)
    fit_efficient_ensembles(config, workdir, models[0], base, study.train)
    workdir.save_stages()
    return models


def trained(
    workdir: Workdir | Path, indices: list[int] | None = None
) -> tuple[list[Model], study_data.StudyData, ml_collections.ConfigDict]:
    """The published classifiers `indices` (default: all) of a baselines workdir
    (`hf/member_M`, read with `from_pretrained`), with its data and recorded config."""
    workdir = Workdir.of(workdir)
    config = workdir.recorded()
    models = []
    for member in members(config) if indices is None else indices:
        path = hf_dir(workdir.path, member)
        if not (path / "config.json").is_file():
            raise WorkdirError(
                f"{path} holds no published classifier of member {member}: run train.py with "
                f"--workdir {workdir} (and its recorded config) to the end first"
            )
        models.append(from_pretrained(path))
    return models, study_data.load_data(config, models[0]), config


def evaluate(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, Any]:
    """Evaluates every method; writes results.json, report.md, plots/ and predictions/."""
    workdir = Workdir.of(workdir)
    workdir.check(config)
    trained = methods.Trained(workdir, config, workdir, config.eval.dtype)
    to_evaluate = methods.build(config.methods, trained)
    study = study_data.load_data(config, trained.member(0))
    return evaluate_methods(config, workdir, to_evaluate, study)
