"""What a study config asks the engine for, and every check of it that can run before the
first training step: the methods, strategies and analyses (`check`, `Plan`), then, once the data
and the starting model are known, the classes, zero-shot data, calibration and single-pass
settings (`check_*`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import ml_collections

from hydra_jax.data import Dataset
from hydra_jax.data.files import DataError
from hydra_jax.ensembles import STRATEGIES
from hydra_jax.experiments import ablations, evaluators, members, methods, pruning, single_pass
from hydra_jax.experiments.analyses import Analysis, Context
from hydra_jax.experiments.study_inputs import (
    Data,
    check_sources,
    checkpoint,
    zero_shot_enabled,
)
from hydra_jax.experiments.workdir import Workdir, split_names
from hydra_jax.models import Model
from hydra_jax.training import TrainSettings

# What a zero-shot study can run: it trains no classifier.
ZERO_SHOT_METHODS = ("single", *(f"{kind}_{s}" for kind in ("pruned", "hydra") for s in STRATEGIES))

# The analyses a study can list (`analyses`): work on member 0 beyond the methods' rows.
ANALYSES: dict[str, Analysis] = {
    "pruning_curves": Analysis(pruning.train, pruning.evaluate, pruning.check),
    "ablations": Analysis(ablations.train, ablations.evaluate, ablations.check),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a study config asks `train` for, checked before a workdir is touched.

    `workdir` holds the members (this run's, or `base_workdir`'s), trained under
    `members_config`; the settings are those of the members, the Hydra members and the fused
    network (None: not fine-tuned)."""

    methods: list[str]
    strategies: list[str]
    analyses: list[str]
    efficient: list[str]
    workdir: Workdir
    members_config: ml_collections.ConfigDict
    trains_members: bool
    zero_shot: bool
    member_settings: TrainSettings
    hydra_settings: TrainSettings
    fused_settings: TrainSettings | None

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, workdir: Workdir) -> Plan:
        names, strategies, analyses = check(config)
        trains_members = config.members_from != "workdir"
        base = workdir if trains_members else Workdir(config.base_workdir)
        members_config = config if trains_members else base.recorded()
        train = members_config.train.to_dict()
        member_train = config.get("member_train")
        hydra_settings = TrainSettings(**{**train, **(member_train or {})})
        fused = config.get("fused_train")
        fused_settings = None  # optional: the fused network fine-tuned as a whole
        if fused is not None and fused.epochs > 0:
            fused_settings = TrainSettings(**{**hydra_settings.__dict__, **fused.to_dict()})
        efficient = [n for n in names if n in single_pass.METHODS] if trains_members else []
        for kind in efficient:
            members.efficient_settings(config, kind)
        return cls(
            names,
            strategies,
            analyses,
            efficient,
            base,
            members_config,
            trains_members,
            zero_shot_enabled(config),
            TrainSettings(**train),
            hydra_settings,
            fused_settings,
        )


def check(config: ml_collections.ConfigDict) -> tuple[list[str], list[str], list[str]]:
    """The methods, member strategies and analyses of a study config, if they can run together.

    Raises:
      ValueError: no methods and no analyses; an unknown method or analysis; a method that
        trains in a zero-shot study; HIES alphas that are not one per member.
    """
    if "experiment" in config:
        raise ValueError(
            "config.experiment is gone: every study runs on the study engine. "
            "Name its rows in config.methods and its other work in "
            f"config.analyses ({', '.join(ANALYSES)})"
        )
    analyses = check_analyses(config.get("analyses", ()))
    names = methods.check_names(config.methods, empty=bool(analyses))
    strategies = methods.strategies(config)
    needs_training = [n for n in names if n not in ZERO_SHOT_METHODS]
    if zero_shot_enabled(config) and needs_training:
        raise ValueError(
            f"zero_shot.enabled trains no classifier, so {needs_training} cannot "
            "run; zero-shot methods: single, pruned_S, hydra_S"
        )
    given = config.get("hies_alphas", ())
    if "hies" in strategies and given and len(given) != config.num_members:
        raise ValueError(
            f"config.hies_alphas has {len(config.hies_alphas)} alphas for "
            f"{config.num_members} members: give one per member, or none (evenly spaced)"
        )
    check_sources(config)
    data = config.get("data")
    files = data is not None and data.get("source") == "files"
    evaluators.check(config, bool(data.get("validation")) if files else None)
    return names, strategies, analyses


def check_analyses_on(
    config: ml_collections.ConfigDict, workdir: Workdir, plan: Plan, single: Model, data: Data
) -> None:
    """Runs the `check` of every analysis of `plan` on member 0 (`single`)."""
    for name in plan.analyses:
        ANALYSES[name].check(Context(config, workdir, plan, single, data))


def check_analyses(names: Sequence[str] | str) -> list[str]:
    """`names` (`split_names`) if every one is a known analysis."""
    names = split_names(names)
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise ValueError(f"config.analyses: {unknown}; known: {', '.join(ANALYSES)}")
    return names


def check_calibration(config: ml_collections.ConfigDict, plan: Plan, calibration: Dataset) -> None:
    """Refuses a `calibration_size` larger than the set head scores draw it from, where a
    strategy, the ablations or the pruning curves score heads on it."""
    strategies = [*plan.strategies]
    if "ablations" in plan.analyses:
        strategies += config.ablations.strategies
    scored = "pruning_curves" in plan.analyses or any(
        STRATEGIES.get(s) == "calibration" for s in strategies
    )
    if scored and config.calibration_size > len(calibration):
        raise ValueError(
            f"calibration_size is {config.calibration_size}, but the set head scores are "
            f"drawn from has {len(calibration)} examples: give at most {len(calibration)}"
        )


def check_single_pass(
    config: ml_collections.ConfigDict, names: Sequence[str], architecture: Any
) -> None:
    """Refuses the settings (`config[KIND]`) of each single-pass ensemble named that its kind
    cannot build on `architecture` (`single_pass.METHODS`: each method's `check`)."""
    for name in names:
        method = single_pass.METHODS[name]
        if method.check is None:
            continue
        try:
            method.check(architecture, config.ensemble_size, config[name])
        except (TypeError, ValueError) as error:
            raise ValueError(f"config.methods names {name}, but {error}") from None


def check_classes(base: Model, config: ml_collections.ConfigDict, data: Data) -> None:
    """Refuses a checkpoint whose own classifier has another number of classes than the data."""
    own = getattr(base.config, "num_labels", 0)
    if own and own != data.num_classes:
        names = f": {list(data.classes.names)}" if data.classes else ""
        raise DataError(
            f"the classifier of {checkpoint(config)} has {own} classes but "
            f"the data have {data.num_classes}{names}"
        )


def check_zero_shot(config: ml_collections.ConfigDict, data: Data) -> None:
    """Refuses zero-shot prompts for data that are text or whose classes have no names.

    Raises:
      DataError: text data, or classes without names (integer labels).
    """
    source = config.data.get("train") or config.data.id_set
    if data.encoder is not None or data.classes is None:
        raise DataError(f"zero-shot classifies images; {source} holds text")
    names = data.classes.names
    if all(name.isdigit() for name in names):
        raise DataError(
            f"zero-shot prompts need class names, but {source} labels its classes "
            f"{list(names)}: use string labels or class folders"
        )
