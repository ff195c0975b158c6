"""The uncertainty baselines: one classifier fine-tuned per seed, evaluated as single / deep
ensemble / MC dropout.

`train(config, workdir)` fine-tunes one classifier per member seed (seed 0 is `single`; seeds
0..M-1 are the deep ensemble); `evaluate(config, workdir)` runs every method of
`config.methods` on the ID test set and each OOD test set and writes the artefacts of
`hydra_jax.evaluation` (via `common.evaluate_methods`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections

from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import Method
from hydra_jax.experiments import common
from hydra_jax.models import Model, with_classifier
from hydra_jax.training import TrainSettings, fit, make_optimizer, make_train_step, schedule_length

NUM_CLASSES = 2


def member_seeds(config: ml_collections.ConfigDict) -> list[int]:
    return list(range(config.ensemble_size)) if "deep_ensemble" in config.methods else [0]


def fit_members(
    config: ml_collections.ConfigDict,
    workdir: Path,
    text: common.TextData | None = None,
    resume_only: bool = False,
    seeds: list[int] | None = None,
    base: Model | None = None,
) -> tuple[list[Model], dict[str, float]]:
    """Fine-tunes (or, with `resume_only`, restores finished) classifiers, one per seed."""
    base = base or common.base_model(config)
    text = text or common.load_data(config, base)
    models, step_fn, timings = [], None, {}
    for seed in member_seeds(config) if seeds is None else seeds:
        settings = TrainSettings(**config.train.to_dict(), seed=seed)
        model = with_classifier(base, NUM_CLASSES, jax.random.key(seed))
        if step_fn is None:
            total = schedule_length(len(text.train), settings)[1]
            step_fn = make_train_step(model, make_optimizer(settings, total))
        start = time.perf_counter()
        directory = Path(workdir) / "members" / f"seed_{seed}"
        models.append(fit(model, text.train, settings, directory, step_fn=step_fn,
                          resume_only=resume_only))  # fmt: skip
        timings[f"train seed {seed}"] = time.perf_counter() - start
    return models, timings


def train(config: ml_collections.ConfigDict, workdir: Path) -> list[Model]:
    """Fine-tunes one classifier per member seed into `workdir` (resuming where it stopped)."""
    workdir = Path(workdir)
    TrainSettings(**config.train.to_dict())  # refuse bad settings before touching the workdir
    common.claim_workdir(config, workdir)
    models, timings = fit_members(config, workdir)
    (workdir / "train_timings.json").write_text(json.dumps(timings, indent=2))
    return models


def trained(
    workdir: Path, seeds: list[int] | None = None
) -> tuple[list[Model], common.TextData, ml_collections.ConfigDict]:
    """The finished members of a baselines workdir, with its data and recorded config."""
    config = common.recorded_config(workdir)
    base = common.base_model(config)
    text = common.load_data(config, base)
    models, _ = fit_members(config, workdir, text, resume_only=True, seeds=seeds, base=base)
    return models, text, config


def methods(
    config: ml_collections.ConfigDict, models: list[Model], names: Sequence[str] | None = None
) -> list[Method]:
    """The baseline methods `names` (default: `config.methods`) of finished `models`."""
    names = config.methods if names is None else names
    single = models[0]
    available = {
        "single": lambda: Method("single", baselines.single(single), single.params),
        "deep_ensemble": lambda: Method(
            "deep_ensemble", baselines.deep_ensemble(single), baselines.stack(models)
        ),
        "mc_dropout": lambda: Method(
            "mc_dropout", baselines.mc_dropout(single, config.mc_dropout_samples), single.params
        ),
    }
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; available: {sorted(available)}")
    return [available[name]() for name in names]


def evaluate(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Any]:
    """Evaluates every method; writes results.json, report.md, plots/ and predictions/."""
    workdir = Path(workdir)
    common.check_workdir(config, workdir)
    models, text, _ = trained(workdir)
    stages = common.read_json(workdir / "train_timings.json", {})
    return common.evaluate_methods(config, workdir, methods(config, models), text, stages)
