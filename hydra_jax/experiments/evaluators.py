"""Evaluation of a study's methods: one prediction loop, then evaluators.

An evaluator is a small object: called on one method's predictions (the arrays of
`predictions/NAME.npz`), it returns that method's metrics under its `key` in `results.json`;
`section` turns every method's results into its part of `report.md`. `standard` gives a
study's evaluators from its config and sets; a new evaluator is one new class there.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.evaluation import Method, cost, ood_metrics, predict, report
from hydra_jax.evaluation import softmax as to_probs
from hydra_jax.experiments.study_data import StudyData, latency_batch
from hydra_jax.experiments.workdir import Workdir

Predictions = dict[str, np.ndarray]


class Evaluator(Protocol):
    key: ClassVar[str]  # where its metrics go in results.json, per method

    def __call__(self, predictions: Predictions, method: Method) -> Any: ...

    def section(self, methods: dict[str, Any]) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class Classification:
    """Accuracy, NLL, Brier, ECE (equal-width bins), aECE, MCE, entropy and, for ensembles,
    mutual information and member disagreement on the ID test set."""

    num_bins: int = 15
    key: ClassVar[str] = "id"

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, float]:
        return metrics.classification(predictions["id_probs"], predictions["labels"], self.num_bins)

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.id_table(methods)


@dataclasses.dataclass(frozen=True)
class OODDetection:
    """Detection of each OOD test set against the ID test set, by every OOD score."""

    ood_sets: tuple[str, ...]
    key: ClassVar[str] = "ood"

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        return ood_metrics(predictions, list(self.ood_sets))

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.ood_table(methods)


@dataclasses.dataclass(frozen=True)
class Shift:
    """Accuracy, NLL and ECE on each shifted copy of the ID test set (`CORRUPTION_SEVERITY`)."""

    names: tuple[str, ...]
    num_bins: int = 15
    key: ClassVar[str] = "shift"

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        return {
            name: metrics.classification(
                predictions[f"shift_{name}_probs"], predictions["shift_labels"], self.num_bins
            )
            for name in self.names
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.shift_tables(methods)


@dataclasses.dataclass(frozen=True)
class Cost:
    """Parameters, XLA FLOPs per example and the median latency of one fixed batch."""

    batch: dict[str, np.ndarray] = dataclasses.field(hash=False, compare=False)
    repeats: int = 10
    key: ClassVar[str] = "cost"

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, float]:
        return cost(method, self.batch, self.repeats)

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.cost_table(methods)


@dataclasses.dataclass(frozen=True)
class HeldOutClasses:
    """Accuracy, NLL and ECE on the seen and the held-out classes separately (`held_out`: a
    bool mask over the ID test set), and misclassification detection (wrong = positive)."""

    held_out: np.ndarray = dataclasses.field(hash=False, compare=False)
    names: tuple[str, ...] = ()  # the held-out classes, for the report
    key: ClassVar[str] = "zero_shot"

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        probs, labels, held = predictions["id_probs"], predictions["labels"], self.held_out
        return {
            "seen": metrics.classification(probs[~held], labels[~held]),
            "held_out": metrics.classification(probs[held], labels[held]),
            "misclassification": metrics.misclassification(probs, labels),
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.held_out_tables(methods, self.names)


def standard(
    config: ml_collections.ConfigDict, study: StudyData, held_out: dict[str, int] | None = None
) -> list[Evaluator]:
    """Classification and calibration, OOD detection, dataset shift (where the study has shifted
    sets), cost, and the seen vs held-out classes (where `held_out`, the classes never trained
    on, name -> index, has some).

    Raises:
      ValueError: held-out classes, but an ID test set without both seen and held-out examples.
    """
    e = config.eval
    evaluators: list[Evaluator] = [Classification(e.num_bins), OODDetection(tuple(study.ood))]
    if study.shift:
        evaluators.append(Shift(tuple(study.shift), e.num_bins))
    evaluators.append(Cost(latency_batch(config, study), e.latency_repeats))
    if held_out:
        mask = np.isin(study.test.labels, list(held_out.values()))
        if mask.all() or not mask.any():
            raise ValueError("the ID test set needs images of both seen and held-out classes")
        evaluators.append(HeldOutClasses(mask, tuple(held_out)))
    return evaluators


def predictions_of(method: Method, study: StudyData, batch_size: int) -> Predictions:
    """Logits and probabilities `[N, M, C]` of `method` on the ID test set (`id_`), each OOD set
    (`ood_NAME_`) and each shifted set (`shift_NAME_`), with the labels."""
    out = {"labels": study.test.labels}
    prefixed = {"id": study.test}
    prefixed |= {f"ood_{name}": s for name, s in study.ood.items()}
    prefixed |= {f"shift_{name}": s for name, s in study.shift.items()}
    for prefix, dataset in prefixed.items():
        logits = predict(method, dataset, batch_size)
        out[f"{prefix}_logits"], out[f"{prefix}_probs"] = logits, to_probs(logits)
    if study.shift:
        out["shift_labels"] = next(iter(study.shift.values())).labels
    return out


def evaluate_methods(
    config: ml_collections.ConfigDict,
    workdir: Workdir,
    to_evaluate: Sequence[Method],
    study: StudyData,
    evaluators: Sequence[Evaluator],
) -> tuple[dict[str, Any], list[list[str]]]:
    """Predictions (`predictions/NAME.npz`) and plots of each method, and its results from
    every evaluator; returns each method's results (`results.json`'s `methods`) and every
    evaluator's report section."""
    results: dict[str, Any] = {}
    for method in to_evaluate:
        with workdir.stage(f"predict {method.name}"):
            predictions = predictions_of(method, study, config.eval.batch_size)
        workdir.write_arrays(workdir.at("predictions", method=method.name), predictions)
        workdir.write_plots(functools.partial(_plots, method.name, predictions, list(study.ood)))
        results[method.name] = {e.key: e(predictions, method) for e in evaluators}
    return results, [e.section(results) for e in evaluators]


def _plots(name: str, predictions: Predictions, ood_sets: list[str], directory: Path) -> None:
    report.reliability_plot(
        directory / f"reliability_{name}.png",
        predictions["id_probs"],
        predictions["labels"],
        f"{name}: reliability (ID test)",
    )
    report.ood_histogram(
        directory / f"ood_scores_{name}.png",
        metrics.ood_score(predictions["id_probs"], "msp"),
        {s: metrics.ood_score(predictions[f"ood_{s}_probs"], "msp") for s in ood_sets},
        f"{name}: MSP scores",
        num_classes=predictions["id_probs"].shape[-1],
    )
