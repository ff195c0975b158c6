"""Evaluation of a study's methods: one prediction loop, then evaluators.

A study declares its evaluators by name (`config.evaluators`, e.g.
`"classification,calibration,selective,conformal,ood,shift,cost"`; empty: every one its data
allow) and its OOD scores (`config.ood_scores`). An evaluator is a small object, one module
each (`classification`, `calibration`, `selective`, `conformal`, `ood`, `shift`, `cost`,
`held_out`): called on one method's `Predictions`, it returns that method's metrics under its
`key` in `results.json`; its `section` turns every method's results into its part of
`report.md`; `needs` names the prediction sets it reads beyond the ID test set. `study` builds
a study's evaluators from its config and data; `predictions_of` is the one prediction loop,
which the analyses (pruning curves, ablations) use too, scoring through the same evaluator
objects. A new evaluator is one module here and one line of `registry.EVALUATORS`.
"""

from hydra_jax.experiments.evaluators.base import (
    FEATURE_SCORES,
    OOD_GROUPS,
    OOD_SCORES,
    OUTPUT_SCORES,
    Evaluator,
    Outputs,
    Predictions,
    Sets,
    Settings,
    eval_fields,
)
from hydra_jax.experiments.evaluators.calibration import Calibration
from hydra_jax.experiments.evaluators.classification import Classification
from hydra_jax.experiments.evaluators.conformal import Conformal
from hydra_jax.experiments.evaluators.cost import Cost
from hydra_jax.experiments.evaluators.held_out import HeldOutClasses
from hydra_jax.experiments.evaluators.loop import (
    evaluate_methods,
    needs_of,
    predictions_of,
    score,
)
from hydra_jax.experiments.evaluators.ood import OODDetection, ood_groups, ood_scores
from hydra_jax.experiments.evaluators.registry import EVALUATORS, check, names, sets_of, study
from hydra_jax.experiments.evaluators.selective import Selective
from hydra_jax.experiments.evaluators.shift import Shift

__all__ = [
    "EVALUATORS",
    "FEATURE_SCORES",
    "OOD_GROUPS",
    "OOD_SCORES",
    "OUTPUT_SCORES",
    "Calibration",
    "Classification",
    "Conformal",
    "Cost",
    "Evaluator",
    "HeldOutClasses",
    "OODDetection",
    "Outputs",
    "Predictions",
    "Selective",
    "Sets",
    "Settings",
    "Shift",
    "check",
    "eval_fields",
    "evaluate_methods",
    "names",
    "needs_of",
    "ood_groups",
    "ood_scores",
    "predictions_of",
    "score",
    "sets_of",
    "study",
]
