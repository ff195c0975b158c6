"""The uncertainty baselines: one classifier trained per seed, evaluated as single / deep
ensemble / MC dropout.

`train(config, workdir)` trains one classifier per member m (member 0 is `single`; members
0..M-1 are the deep ensemble), with training seed `1000 * config.seed + m`: a pretrained
checkpoint fine-tuned with a new classifier (`config.checkpoint`), or a ViT trained from scratch
(`config.model`). Each finished classifier is published as a HuggingFace directory
`workdir/hf/member_M`, and everything downstream
(`evaluate`, the pruning and Hydra experiments) loads those directories with
`hydra_jax.from_pretrained`, as a user would load a hub checkpoint. `evaluate(config, workdir)`
runs every method of `config.methods` on the ID test set, each OOD test set and each shifted
test set and writes the artefacts of `hydra_jax.evaluation` (via `common.evaluate_methods`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections

from hydra_jax.convert import from_pretrained
from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import Method
from hydra_jax.experiments import common
from hydra_jax.models import Model, with_classifier, with_dtype
from hydra_jax.models.sharding import is_primary
from hydra_jax.training import TrainSettings, fit, make_optimizer, make_train_step, schedule_length


def members(config: ml_collections.ConfigDict) -> list[int]:
    """The member indices a baselines run trains (one unless it has a deep ensemble)."""
    return list(range(config.ensemble_size)) if "deep_ensemble" in config.methods else [0]


def training_seed(config: ml_collections.ConfigDict, member: int) -> int:
    """Member `member`'s seed in study `config.seed` (0 when absent): studies share no model."""
    return 1000 * config.get("seed", 0) + member


def initial_model(config: ml_collections.ConfigDict, seed: int, base: Model | None) -> Model:
    """Seed `seed`'s starting point: a fresh ViT of `config.model`, or `base` (the pretrained
    checkpoint) with a new classifier."""
    if "model" in config:
        return Model.init(common.scratch_config(config), jax.random.key(seed))
    assert base is not None
    return with_classifier(base, common.num_classes(config), jax.random.key(seed))


def hf_dir(workdir: Path, member: int) -> Path:
    return Path(workdir) / "hf" / f"member_{member}"


def fit_members(
    config: ml_collections.ConfigDict, workdir: Path, study: common.StudyData | None = None
) -> tuple[list[Model], dict[str, float]]:
    """Trains one classifier per seed (resuming where a run stopped) and publishes each as an
    HF directory."""
    base = None if "model" in config else common.base_model(config)
    study = study or common.load_data(config, base)
    models, step_fn, timings = [], None, {}
    for member in members(config):
        seed = training_seed(config, member)
        settings = TrainSettings(**config.train.to_dict(), seed=seed)
        model = initial_model(config, seed, base)
        if step_fn is None:
            total = schedule_length(len(study.train), settings)[1]
            step_fn = make_train_step(model, make_optimizer(settings, total))
        start = time.perf_counter()
        published = (hf_dir(workdir, member) / "config.json").is_file()  # finished before
        directory = Path(workdir) / "members" / f"member_{member}"
        model = fit(model, study.train, settings, directory, step_fn=step_fn)
        common.publish(config, model, hf_dir(workdir, member))
        models.append(model)
        if not published:  # a restored member keeps the time of the run that trained it
            timings[f"train member {member} (seed {seed})"] = time.perf_counter() - start
    return models, timings


def train(config: ml_collections.ConfigDict, workdir: Path) -> list[Model]:
    """Trains one classifier per member seed into `workdir` (resuming where it stopped)."""
    workdir = Path(workdir)
    TrainSettings(**config.train.to_dict())  # refuse bad settings before touching the workdir
    common.claim_workdir(config, workdir)
    models, timings = fit_members(config, workdir)
    timings = {**common.read_json(workdir / "train_timings.json", {}), **timings}
    if is_primary():
        (workdir / "train_timings.json").write_text(json.dumps(timings, indent=2))
    return models


def trained(
    workdir: Path, indices: list[int] | None = None
) -> tuple[list[Model], common.StudyData, ml_collections.ConfigDict]:
    """The published classifiers `indices` (default: all) of a baselines workdir
    (`hf/member_M`, read with `from_pretrained`), with its data and recorded config."""
    config = common.recorded_config(workdir)
    models = []
    for member in members(config) if indices is None else indices:
        path = hf_dir(workdir, member)
        if not (path / "config.json").is_file():
            raise common.WorkdirError(
                f"{path} holds no published classifier of member {member}: run train.py with "
                f"--workdir {workdir} (and its recorded config) to the end first"
            )
        models.append(from_pretrained(path))
    return models, common.load_data(config, models[0]), config


def methods(
    config: ml_collections.ConfigDict,
    models: list[Model],
    names: Sequence[str] | None = None,
    dtype: str = "float32",
) -> list[Method]:
    """The baseline methods `names` (default: `config.methods`) of finished `models`, computing
    in `dtype` (`hydra_jax.with_dtype`)."""
    names = config.methods if names is None else names
    models = [with_dtype(m, dtype) for m in models]
    single = models[0]
    available = {
        "single": lambda: Method("single", baselines.single(single), single.params),
        "deep_ensemble": lambda: Method(
            "deep_ensemble", baselines.deep_ensemble(single), baselines.stack(models), True
        ),
        "mc_dropout": lambda: Method(
            "mc_dropout",
            baselines.mc_dropout(single, config.mc_dropout_samples),
            single.params,
            loop_trips=config.mc_dropout_samples,
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
    models, study, _ = trained(workdir)
    stages = common.read_json(workdir / "train_timings.json", {})
    to_evaluate = methods(config, models, dtype=config.eval.dtype)
    return common.evaluate_methods(config, workdir, to_evaluate, study, stages)
