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

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from hydra_jax import ensembles
from hydra_jax.convert.native import CONFIG_FILE, load_model, save_model
from hydra_jax.data import Dataset, concat_all, labelled_batches, subset, uncertainty_batches
from hydra_jax.evaluation import Method, logits_forward
from hydra_jax.experiments import baselines, common
from hydra_jax.heads import UncertaintyBatches, his_and_entropy
from hydra_jax.models import Model, with_dtype
from hydra_jax.models.sharding import is_primary
from hydra_jax.training import TrainSettings, fit, make_optimizer, make_train_step, schedule_length

# Strategies whose member 0 alone is also a method (`pruned_STRATEGY`): one pruned model at the
# members' ratio. `pruned_circuit` (one circuit, fine-tuned) stands in for the paper's CircAvg.
PRUNED = ("taylor", "hies", "circuit")
STRATEGIES = ("taylor", "circuit", "hies", "stratified")  # `head_sets`' member strategies


def validation_sets(base: ml_collections.ConfigDict) -> tuple[Dataset, Dataset]:
    """The study's ID validation split and its OOD validation splits pooled."""
    encoder = None if common.is_images(base) else common.text_encoder(base)
    id_val = common.load_split(base, base.data.id_set, "validation", encoder=encoder)
    ood_val = concat_all([common.load_split(base, n, "validation", encoder=encoder)
                          for n in base.data.ood_sets])  # fmt: skip
    return id_val, ood_val


def member_uncertainty_sets(
    config: ml_collections.ConfigDict,
    base: ml_collections.ConfigDict,
    id_val: Dataset,
    ood_val: Dataset,
) -> list[UncertaintyBatches]:
    """Per member m: `circuit.examples` / 2 ID and as many OOD validation examples, drawn with
    member m's training seed."""
    half = config.circuit.examples // 2
    size = config.eval.batch_size
    return [
        uncertainty_batches(subset(id_val, half, seed), subset(ood_val, half, seed), size)
        for seed in (baselines.training_seed(base, m) for m in range(config.num_members))
    ]


def head_sets(
    config: ml_collections.ConfigDict,
    base: ml_collections.ConfigDict,
    strategy: str,
    single: Model,
    train: Any,
    validation: Callable[[], tuple[Dataset, Dataset]] | None = None,
) -> np.ndarray:
    """Member head sets `[M, L, N]` for one strategy; `validation` gives the ID and pooled OOD
    validation sets of circuit search (default: the embedded sets of `base`'s study)."""
    M = config.num_members
    n = single.config.encoder.num_heads[0] // M
    calibration = [
        labelled_batches(train, config.calibration_size, seed, config.eval.batch_size)
        for seed in (baselines.training_seed(base, m) for m in range(M))
    ]
    if strategy == "taylor":
        return ensembles.taylor_head_sets(single, calibration, n)
    if strategy == "hies":
        return ensembles.hies_head_sets(single, calibration[0], config.hies_alphas, n)
    if strategy == "stratified":
        return ensembles.stratified_head_sets(his_and_entropy(single, calibration[0])[0], M)
    if strategy == "circuit":
        id_val, ood_val = validation() if validation else validation_sets(base)
        sets = member_uncertainty_sets(config, base, id_val, ood_val)
        return ensembles.circuit_head_sets(single, sets, config.circuit.objectives, n)
    raise ValueError(f"unknown member strategy {strategy!r}")


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
    train: Any,
    settings: TrainSettings,
    base: ml_collections.ConfigDict,
    directory: Path,
    steps: dict[Any, Any] | None = None,
) -> list[Model]:
    """`single` compacted to each head set `[M, L, N]`, member m fine-tuned (resuming) under
    `directory/member_m` with the baselines' training seed of member m (none if 0 epochs).

    `steps` caches compiled train steps across calls (`shared_step`).
    """
    members, steps = [], {} if steps is None else steps
    for m, member in enumerate(ensembles.members_from(single, sets)):
        if settings.epochs > 0:
            step_fn = shared_step(steps, member, len(train), settings)  # members of one shape
            member_settings = dataclasses.replace(settings, seed=baselines.training_seed(base, m))
            member = fit(member, train, member_settings, directory / f"member_{m}", step_fn=step_fn)
        members.append(member)
    return members


def train(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, list]:
    """Builds and saves every Hydra of `config.strategies` (resuming member fine-tuning)."""
    workdir = Path(workdir)
    start = time.perf_counter()
    (single,), study, base = baselines.trained(Path(config.base_workdir), indices=[0])
    settings = TrainSettings(**{**base.train.to_dict(), **config.member_train.to_dict()})
    fused_settings = None  # optional: fine-tune the fused network as a whole
    if config.fused_train.epochs > 0:  # checked here, before any member trains
        fused_settings = TrainSettings(**{**settings.__dict__, **config.fused_train.to_dict()})
    common.claim_workdir(config, workdir)
    stages = {"load baselines": time.perf_counter() - start}
    record: dict[str, Any] = {}
    steps: dict[Any, Any] = {}  # compiled train steps (`shared_step`): members', fused ones'
    for strategy in config.strategies:
        start = time.perf_counter()
        sets = head_sets(config, base, strategy, single, study.train)
        stages[f"{strategy}: head sets"] = time.perf_counter() - start
        record[strategy] = sets.astype(int).tolist()
        start = time.perf_counter()
        members = fine_tuned_members(
            single, sets, study.train, settings, base, workdir / "members" / strategy, steps
        )
        stages[f"{strategy}: fine-tune members"] = time.perf_counter() - start
        fused = ensembles.fuse(members)
        if fused_settings is not None:
            start = time.perf_counter()
            step_fn = shared_step(steps, fused, len(study.train), fused_settings)
            directory = workdir / "fused_training" / strategy
            fused = fit(fused, study.train, fused_settings, directory, step_fn=step_fn)
            stages[f"{strategy}: fine-tune fused"] = time.perf_counter() - start
        save_model(fused, workdir / "fused" / strategy)
        if strategy in PRUNED:  # the pruned_* baselines: member 0 alone
            save_model(members[0], workdir / "pruned" / strategy)
    if is_primary():
        (workdir / "head_sets.json").write_text(json.dumps(record))
        (workdir / "train_timings.json").write_text(json.dumps(stages, indent=2))
    return record


def evaluate(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Any]:
    """Evaluates `config.methods`: the saved Hydras and the baselines of `config.base_workdir`."""
    workdir = Path(workdir)
    common.check_workdir(config, workdir)
    available: dict[str, Any] = {}
    for strategy in config.strategies:
        path = workdir / "fused" / strategy
        if not (path / CONFIG_FILE).is_file():
            raise common.WorkdirError(
                f"{path} holds no fused Hydra: run train.py with this --config and --workdir "
                f"{workdir} first"
            )
        available[f"hydra_{strategy}"] = functools.partial(
            saved_method, f"hydra_{strategy}", path, config.eval.dtype
        )
        if strategy in PRUNED:
            pruned = workdir / "pruned" / strategy
            available[f"pruned_{strategy}"] = functools.partial(
                saved_method, f"pruned_{strategy}", pruned, config.eval.dtype
            )
    start = time.perf_counter()
    base_methods = [m for m in ("single", "deep_ensemble", "mc_dropout") if m in config.methods]
    indices = None if "deep_ensemble" in config.methods else [0]
    models, study, base = baselines.trained(Path(config.base_workdir), indices)
    stages = {"load baselines": time.perf_counter() - start}
    stages.update(common.read_json(workdir / "train_timings.json", {}))
    for method in baselines.methods(base, models, base_methods, config.eval.dtype):
        available[method.name] = lambda m=method: m
    missing = sorted(set(config.methods) - set(available))
    if missing:
        raise ValueError(f"methods {missing} need strategies that config.strategies lacks")
    to_evaluate = [available[name]() for name in config.methods]
    return common.evaluate_methods(config, workdir, to_evaluate, study, stages)


def saved_method(name: str, path: Path, dtype: str) -> Method:
    """The model `save_model` wrote to `path` as method `name`, computing in `dtype`."""
    model = with_dtype(load_model(path), dtype)  # a fused Hydra, or one pruned member
    return Method(name, logits_forward(model), model.params)
