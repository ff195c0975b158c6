"""The Hydra Ensembles experiment: members from the fine-tuned single model, fused, evaluated.

`train(config, workdir)`: the published `single` model of a baselines workdir -> member head
sets per strategy (`taylor`, `circuit`, `hies`, `stratified`) -> each member compacted and
fine-tuned (member m with the baselines' training seed of member m) -> fused into one network
(optionally fine-tuned as a whole) -> saved under `workdir/fused/STRATEGY`.
`evaluate(config, workdir)`: the saved fused models beside `single`, `deep_ensemble`,
`mc_dropout` and the one-pruned-model baselines `pruned_taylor` / `pruned_hies` /
`pruned_circuit` (member 0 of the matching Hydra run alone: one model at the members' pruning
ratio).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import ml_collections

from hydra_jax import ensembles
from hydra_jax.convert.native import save_model
from hydra_jax.experiments import baselines, members, methods, study_data
from hydra_jax.experiments.evaluators import evaluate_methods
from hydra_jax.experiments.workdir import Workdir
from hydra_jax.training import TrainSettings, fit

# Strategies whose member 0 alone is also a method (`pruned_STRATEGY`): one pruned model at the
# members' ratio. `pruned_circuit` (one circuit, fine-tuned) stands in for the paper's CircAvg.
PRUNED = ("taylor", "hies", "circuit")


def train(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, list]:
    """Builds and saves every Hydra of `config.strategies` (resuming member fine-tuning)."""
    workdir = Workdir.of(workdir)
    methods.check_names(config.methods)  # before any member trains
    with workdir.stage("load baselines"):
        (single,), study, base = baselines.trained(Workdir(config.base_workdir), indices=[0])
    settings = TrainSettings(**{**base.train.to_dict(), **config.member_train.to_dict()})
    fused_settings = None  # optional: fine-tune the fused network as a whole
    if config.fused_train.epochs > 0:  # checked here, before any member trains
        fused_settings = TrainSettings(**{**settings.__dict__, **config.fused_train.to_dict()})
    workdir.claim(config)
    seeds = members.member_seeds(base, config.num_members)
    validation = functools.partial(study_data.validation_sets, base)
    record: dict[str, Any] = {}
    steps: dict[Any, Any] = {}  # compiled train steps (`shared_step`): members', fused ones'
    for strategy in config.strategies:
        with workdir.stage(f"{strategy}: head sets"):
            sets = members.head_sets(config, strategy, single, study.train, seeds, validation)
        record[strategy] = sets.astype(int).tolist()
        with workdir.stage(f"{strategy}: fine-tune members"):
            directory = workdir / "members" / strategy
            fine_tuned = members.fine_tuned_members(
                single, sets, study.train, settings, seeds, directory, steps
            )
        fused = ensembles.fuse(fine_tuned)
        if fused_settings is not None:
            with workdir.stage(f"{strategy}: fine-tune fused"):
                step_fn = members.shared_step(steps, fused, len(study.train), fused_settings)
                directory = workdir / "fused_training" / strategy
                fused = fit(fused, study.train, fused_settings, directory, step_fn=step_fn)
        save_model(fused, workdir / "fused" / strategy)
        if strategy in PRUNED:  # the pruned_* baselines: member 0 alone
            save_model(fine_tuned[0], workdir / "pruned" / strategy)
    workdir.write_json("head_sets.json", record)
    workdir.write_json("train_timings.json", workdir.stages, sort_keys=False)
    return record


def evaluate(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, Any]:
    """Evaluates `config.methods`: the saved Hydras and pruned members, and the baselines of
    `config.base_workdir`."""
    workdir = Workdir.of(workdir)
    workdir.check(config)
    base = Workdir(config.base_workdir)
    trained = methods.Trained(base, base.recorded(), workdir, config.eval.dtype)
    with workdir.stage("load baselines"):
        to_evaluate = methods.build(config.methods, trained)
        study = study_data.load_data(trained.members_config, trained.member(0))
    return evaluate_methods(config, workdir, to_evaluate, study)
