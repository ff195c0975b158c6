"""Every evaluator by name, and the checks of what a config declares.

A new evaluator is one module of this package (its class, with its report section, and a
`build(settings, sets, config)`) and one line of `EVALUATORS`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import ml_collections
import numpy as np

from hydra_jax.data import Dataset, subset
from hydra_jax.experiments.evaluators import (
    calibration,
    classification,
    conformal,
    cost,
    ood,
    selective,
    shift,
)
from hydra_jax.experiments.evaluators.base import Evaluator, Sets, Settings, chosen_names
from hydra_jax.experiments.evaluators.held_out import HeldOutClasses
from hydra_jax.experiments.study_data import StudyData
from hydra_jax.experiments.user_files import named_specs
from hydra_jax.experiments.workdir import split_names
from hydra_jax.metrics import detectors

Build = Callable[[Settings, Sets, ml_collections.ConfigDict], Evaluator]
EVALUATORS: dict[str, Build] = {
    "classification": classification.build,
    "calibration": calibration.build,
    "selective": selective.build,
    "conformal": conformal.build,
    "ood": ood.build,
    "shift": shift.build,
    "cost": cost.build,
}
# What each evaluator needs of the study's sets to run at all (others always run).
NEEDS_VALIDATION = ("calibration", "conformal")


def names(config: ml_collections.ConfigDict) -> list[str]:
    """The evaluators `config.evaluators` names (empty: every one of `EVALUATORS`), checked."""
    return chosen_names(config, "evaluators", list(EVALUATORS)) or list(EVALUATORS)


def check(config: ml_collections.ConfigDict, has_validation: bool | None = None) -> None:
    """Refuses unknown evaluators or OOD scores, bad evaluation settings or OOD groups, and
    (where `has_validation` is known) evaluators that need a validation split the study lacks.

    Raises:
      ValueError: naming the field and what it accepts.
    """
    chosen = names(config)
    ood.ood_scores(config)
    s = Settings.of(config)
    if not 0 < s.alpha < 1:
        raise ValueError(f"eval.alpha must lie in (0, 1), got {s.alpha!r}")
    if not s.raps_penalty >= 0:
        raise ValueError(f"eval.raps_penalty must be >= 0, got {s.raps_penalty!r}")
    if s.features_dtype not in ("float16", "float32"):
        raise ValueError(
            f"eval.features_dtype must be float16 or float32, got {s.features_dtype!r}"
        )
    if s.covariance not in detectors.COVARIANCES:
        raise ValueError(
            f"eval.covariance must be one of {', '.join(detectors.COVARIANCES)}, got "
            f"{s.covariance!r}"
        )
    data = config.get("data")
    if data is not None and data.get("source") == "files":
        ood_sets = list(named_specs(data.get("ood", ""), "data.ood"))
        reserved = [n for n in ood_sets if n.startswith("mean")]
        if reserved:
            raise ValueError(
                f"data.ood: {reserved}: OOD set names starting with 'mean' are the results' "
                "means over sets (`mean`, `mean_near`, `mean_far`); rename them"
            )
        ood.ood_groups(config, ood_sets)
        shifts = list(named_specs(data.get("shift", ""), "data.shift"))
        if [n for n in shifts if n == "mean"]:
            raise ValueError("data.shift: 'mean' is the results' mean over shifted sets; rename it")
    elif data is not None and data.get("source") == "embedded":
        ood.ood_groups(config, list(data.get("ood_sets", ())))
    explicit = bool(split_names(config.get("evaluators", "")))
    needing = [n for n in chosen if n in NEEDS_VALIDATION]
    if has_validation is False and explicit and needing:
        raise ValueError(
            f"config.evaluators {needing} calibrate on an ID validation split, which this study "
            "has none of: give one (data.validation) or leave them out"
        )


def study(
    config: ml_collections.ConfigDict,
    sets: Sets,
    held_out: dict[str, int] | None = None,
    leave_out: Collection[str] = (),
) -> list[Evaluator]:
    """The evaluators of `config.evaluators` that the study's sets allow (calibration and
    conformal need validation data, shift needs shifted sets), but those of `leave_out`, and
    the seen vs held-out classes where `held_out` (the classes never trained on, name ->
    index) has some.

    Raises:
      ValueError: held-out classes, but an ID test set without both seen and held-out examples.
    """
    settings = Settings.of(config)
    allowed = dict.fromkeys(NEEDS_VALIDATION, sets.validation is not None)
    allowed["shift"] = bool(sets.shift)
    evaluators = [
        EVALUATORS[name](settings, sets, config)
        for name in names(config)
        if allowed.get(name, True) and name not in leave_out
    ]
    if held_out:
        mask = np.isin(sets.test.labels, list(held_out.values()))
        if mask.all() or not mask.any():
            raise ValueError("the ID test set needs images of both seen and held-out classes")
        evaluators.append(HeldOutClasses(mask, tuple(held_out)))
    return evaluators


def sets_of(
    config: ml_collections.ConfigDict,
    data: StudyData,
    validation: Dataset | None,
    groups: dict[str, str] | None = None,
) -> Sets:
    """A study's `Sets`: its test, OOD and shifted sets with the OOD sets' `groups`, and fixed
    random subsets (seed 0) of its validation (`eval.calibration_limit`) and training
    (`eval.feature_fit_limit`) sets."""
    s = Settings.of(config)

    def cut(dataset: Dataset | None, limit: int) -> Dataset | None:
        if dataset is None or not 0 < limit < len(dataset):
            return dataset
        return subset(dataset, limit)

    return Sets(
        test=data.test,
        ood=data.ood,
        shift=data.shift,
        validation=cut(validation, s.calibration_limit),
        train=cut(data.train, s.feature_fit_limit),
        groups=groups or {},
    )
