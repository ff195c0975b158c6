"""The Hydra Ensembles experiment: members from the fine-tuned single model, fused, evaluated.

Pipeline: the fine-tuned `single` model of a baselines workdir -> member head sets per strategy
(`taylor`, `circuit`, `hies`, `stratified`) -> each member compacted and fine-tuned (seed m) ->
fused into one network -> evaluated beside `single`, `deep_ensemble`, `mc_dropout` and the
one-pruned-model baselines `pruned_taylor` / `pruned_hies` (member 0 of the matching Hydra run
alone: one model at the members' pruning ratio).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from tqdm.auto import tqdm

from hydra_jax import baselines, hydra, pipeline
from hydra_jax.evaluation import Method
from hydra_jax.heads import his_and_entropy
from hydra_jax.heads.circuit import CircuitSearch, UncertaintySet
from hydra_jax.models import Model
from hydra_jax.pruning import calibration_batches
from hydra_jax.training import (
    TokenizedSet,
    TrainSettings,
    fit,
    make_optimizer,
    make_train_step,
    schedule_length,
)


def uncertainty_sets(
    config: ml_collections.ConfigDict, base: ml_collections.ConfigDict
) -> list[UncertaintySet]:
    """Per member m: half ID validation, half OOD validation (all OOD sets pooled), seed m."""
    id_val = pipeline.tokenized_split(base, base.data.id_set, "validation")
    ood_parts = [pipeline.tokenized_split(base, n, "validation") for n in base.data.ood_sets]
    ood_tokens = [t for p in ood_parts for t in p.tokens]
    ood_labels = np.concatenate([p.labels for p in ood_parts])
    ood_val = TokenizedSet(ood_tokens, ood_labels, id_val.pad_id)
    half = config.circuit.examples // 2
    return [
        UncertaintySet.build(
            id_val.subset(half, m), ood_val.subset(half, m), config.eval.batch_size
        )
        for m in range(config.num_members)
    ]


def head_sets(
    config: ml_collections.ConfigDict,
    base: ml_collections.ConfigDict,
    strategy: str,
    single: Model,
    train: TokenizedSet,
) -> np.ndarray:
    """Member head sets `[M, L, N]` for one strategy."""
    M = config.num_members
    n = single.config.encoder.num_heads[0] // M
    calibration = [
        calibration_batches(train, config.calibration_size, m, config.eval.batch_size)
        for m in range(M)
    ]
    if strategy == "taylor":
        return hydra.taylor_head_sets(single, calibration, n)
    if strategy == "hies":
        return hydra.hies_head_sets(single, calibration[0], config.hies_alphas, n)
    if strategy == "stratified":
        return hydra.stratified_head_sets(his_and_entropy(single, calibration[0])[0], M)
    if strategy == "circuit":
        sets = uncertainty_sets(config, base)
        objectives = config.circuit.objectives
        search = CircuitSearch(single)  # compiled once for every member
        return np.stack(
            [
                search(sets[m], n, objectives[m % len(objectives)])
                for m in tqdm(range(M), desc="circuit search", leave=False)
            ]
        )
    raise ValueError(f"unknown member strategy {strategy!r}")


def run(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Any]:
    """Builds every Hydra of `config.strategies` and evaluates `config.methods`."""
    workdir = Path(workdir)
    pipeline.write_config(config, workdir)
    base_dir = Path(config.base_workdir)
    base = pipeline.base_config(base_dir)
    stages: dict[str, float] = {}
    start = time.perf_counter()
    seeds = list(range(base.ensemble_size)) if "deep_ensemble" in config.methods else [0]
    trained, text = pipeline.trained(base_dir, base, seeds=seeds)
    single = trained[0]
    stages["load baselines"] = time.perf_counter() - start

    settings = TrainSettings(**{**base.train.to_dict(), **config.member_train.to_dict()})
    step_fn = None
    available: dict[str, Method] = {}
    record: dict[str, Any] = {}
    for strategy in config.strategies:
        start = time.perf_counter()
        sets = head_sets(config, base, strategy, single, text.train)
        stages[f"{strategy}: head sets"] = time.perf_counter() - start
        record[strategy] = sets.astype(int).tolist()
        start = time.perf_counter()
        members = []
        for m, member in enumerate(hydra.members_from(single, sets)):
            if settings.epochs > 0:
                if step_fn is None:
                    total = schedule_length(len(text.train.tokens), settings)[1]
                    step_fn = make_train_step(member, make_optimizer(settings, total))
                directory = workdir / "members" / strategy / f"seed_{m}"
                member_settings = dataclasses.replace(settings, seed=m)
                member = fit(member, text.train, member_settings, directory, step_fn=step_fn)
            members.append(member)
        stages[f"{strategy}: fine-tune members"] = time.perf_counter() - start
        fused = hydra.fuse(members)
        if config.fused_train.epochs > 0:  # optional: fine-tune the fused network as a whole
            start = time.perf_counter()
            fused_settings = TrainSettings(**{**settings.__dict__, **config.fused_train.to_dict()})
            fused = fit(fused, text.train, fused_settings, workdir / "fused_training" / strategy)
            stages[f"{strategy}: fine-tune fused"] = time.perf_counter() - start
        hydra.save(fused, workdir / "fused" / strategy)
        available[f"hydra_{strategy}"] = Method(f"hydra_{strategy}", _logits(fused), fused.params)
        if strategy in ("taylor", "hies"):
            available[f"pruned_{strategy}"] = Method(
                f"pruned_{strategy}", baselines.single(members[0]), members[0].params
            )
    (workdir / "head_sets.json").write_text(json.dumps(record))
    available.update(
        {m.name: m for m in pipeline.methods(base, trained) if m.name in config.methods}
    )
    missing = sorted(set(config.methods) - set(available))
    if missing:
        raise ValueError(f"methods {missing} need strategies that config.strategies lacks")
    to_evaluate = [available[name] for name in config.methods]
    return pipeline.evaluate_methods(config, workdir, to_evaluate, text, stages)


def _logits(fused: Model):
    def forward(params: Any, batch: dict) -> Any:
        return fused.apply(params, **batch).logits  # [B, M, C]

    return forward
