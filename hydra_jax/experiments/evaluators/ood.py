"""OOD detection of each OOD test set against the ID test set, by output and feature scores."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import (
    FEATURE_SCORES,
    OOD_GROUPS,
    OOD_SCORES,
    OUTPUT_SCORES,
    Outputs,
    Predictions,
    Sets,
    Settings,
    chosen_names,
    pct,
)
from hydra_jax.experiments.study_data import OOD_GROUPS as OWN_GROUPS
from hydra_jax.experiments.workdir import split_names
from hydra_jax.metrics import detectors

_OOD_KEYS = ("auroc", "aupr", "aupr_in", "fpr95")


@dataclasses.dataclass(frozen=True)
class OODDetection:
    """Detection of each OOD test set against the ID test set by every score of `scores`: the
    output scores of `metrics.ood_score`, and the feature detectors of `metrics.detectors`
    (fitted per member on the training subset's features; the member mean of the score). The
    results hold, per set, MSP's AUROC / AUPR / FPR95 and every score's (`by_score`), and the
    means over all sets (`mean`) and over each group's (`mean_near`, `mean_far`); a feature
    detector's mean AUROC of each member alone is under `mean.by_member`. A detector
    that cannot be fitted on the training subset (ViM with fewer examples than feature
    dimensions, KNN with fewer than k) is left out, its reason under `mean.skipped`. Every
    entry holds AUROC, AUPR (OOD positive), AUPR-In (ID positive) and FPR95."""

    ood_sets: tuple[str, ...]
    scores: tuple[str, ...] = OUTPUT_SCORES
    groups: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    knn_k: int = 50
    vim_dim: int = 0
    covariance: str = "pinv"
    # Each member's fitted detectors by what they were fitted on (`detectors.member_scores`):
    # scoring resampled test sets (`hydra-jax compare`) fits nothing anew.
    fitted: dict[str, Any] = dataclasses.field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    key: ClassVar[str] = "ood"

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"features"} if set(self.scores) & set(FEATURE_SCORES) else ())

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, Any]:
        members = predictions.id.probs.shape[1]
        names = [s for s in self.scores if s != "mi" or members > 1]
        sets = {"id": predictions.id} | {n: predictions.ood[n] for n in self.ood_sets}
        scores = {n: _output_scores(outputs, names) for n, outputs in sets.items()}
        skipped: dict[str, str] = {}
        by_member: dict[str, list[float]] = {}  # a feature detector's mean AUROC per member
        for detector in (s for s in names if s in FEATURE_SCORES):
            try:
                fitted = self._feature_scores(predictions, detector, sets)
            except detectors.CannotFitError as error:
                skipped[detector] = str(error)
                continue
            for n, s in fitted.items():
                scores[n][detector] = s.mean(1)  # the member mean of the score
            by_member[detector] = [
                float(np.mean([metrics.ood(fitted["id"][:, m], fitted[n][:, m])["auroc"]
                               for n in self.ood_sets]))
                for m in range(members)
            ] if self.ood_sets else []  # fmt: skip
        names = [s for s in names if s not in skipped]
        ood: dict[str, Any] = {}
        for name in self.ood_sets:
            by_score = {s: metrics.ood(scores["id"][s], scores[name][s]) for s in names}
            ood[name] = {**by_score["msp"], "by_score": by_score}
            if name in self.groups:
                ood[name]["group"] = self.groups[name]
        for label, averaged in self._means().items():
            by_score = {
                s: {
                    k: float(np.mean([ood[n]["by_score"][s][k] for n in averaged]))
                    for k in _OOD_KEYS
                }
                for s in names
            }
            ood[label] = {**by_score["msp"], "by_score": by_score}
        if self.ood_sets and by_member:
            ood["mean"]["by_member"] = by_member
        if self.ood_sets and skipped:
            ood["mean"]["skipped"] = skipped
        return ood

    def _means(self) -> dict[str, list[str]]:
        """The OOD sets each mean averages: all (`mean`), and each group's."""
        if not self.ood_sets:  # a study may have none (calibration only)
            return {}
        means = {"mean": list(self.ood_sets)}
        for group in OOD_GROUPS:
            grouped = [n for n in self.ood_sets if self.groups.get(n) == group]
            if grouped:
                means[f"mean_{group}"] = grouped
        return means

    def _feature_scores(
        self, predictions: Predictions, detector: str, sets: dict[str, Outputs]
    ) -> dict[str, np.ndarray]:
        train = predictions.train
        if train is None or train.features is None:
            raise detectors.CannotFitError("the method's model outputs no features")
        num_classes = predictions.id.logits.shape[-1]
        return detectors.member_scores(
            detector,  # type: ignore[arg-type]
            (train.features, train.labels, train.logits),
            {n: (o.features, o.logits) for n, o in sets.items()},
            num_classes,
            self.knn_k,
            self.vim_dim,
            self.covariance,
            self.fitted,
        )

    def section(self, methods: dict[str, Any]) -> list[str]:
        """`msp_table`, then per score the mean AUROC / FPR95 over all OOD sets and over each
        group's (near, far); feature detectors: the member mean of the score."""
        lines = msp_table(methods, self.key)
        if not lines:
            return lines
        first = next(iter(methods.values()))[self.key]
        means = [k for k in ("mean", "mean_near", "mean_far") if k in first]
        groups = {n: r.get("group") for n, r in first.items() if not n.startswith("mean")}
        for label in means:
            group = label.removeprefix("mean").strip("_")
            averaged = [n for n, g in groups.items() if not group or g == group]
            lines += [
                "",
                f"## OOD detection by score, AUROC / FPR95 in %: mean over "
                f"{group + ' OOD sets' if group else 'all OOD sets'} ({', '.join(averaged)})",
                "",
                "| method | " + " | ".join(self.scores) + " |",
                "|---|" + "---|" * len(self.scores),
            ]
            for name, r in methods.items():
                by = r[self.key][label]["by_score"]
                cells = [
                    f"{pct(by[s]['auroc'])} / {pct(by[s]['fpr95'])}" if s in by else "-"
                    for s in self.scores
                ]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return lines


def _output_scores(outputs: Outputs, names: Sequence[str]) -> dict[str, np.ndarray]:
    return {
        s: metrics.ood_score(outputs.probs, s, outputs.logits) for s in names if s in OUTPUT_SCORES
    }


def msp_table(methods: dict[str, Any], key: str = "ood") -> list[str]:
    """AUROC / AUPR / FPR95 (MSP score) of each method per OOD set (none: no lines)."""
    ood_sets = [s for s in next(iter(methods.values()))[key] if not s.startswith("mean")]
    if not ood_sets:  # a study may have none (calibration only)
        return []
    lines = [
        "",
        "## OOD detection (MSP score; OOD is the positive class), AUROC / AUPR / FPR95 in %",
        "",
        "| method | " + " | ".join([*ood_sets, "mean"]) + " |",
        "|---|" + "---|" * (len(ood_sets) + 1),
    ]
    for name, r in methods.items():
        cells = [
            " / ".join(pct(r[key][s][k]) for k in ("auroc", "aupr", "fpr95"))
            for s in [*ood_sets, "mean"]
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def ood_scores(config: ml_collections.ConfigDict) -> list[str]:
    """The OOD scores `config.ood_scores` names (empty: the output scores), MSP first."""
    chosen = chosen_names(config, "ood_scores", OOD_SCORES) or list(OUTPUT_SCORES)
    return ["msp", *(s for s in chosen if s != "msp")]


def ood_groups(config: ml_collections.ConfigDict, ood_sets: Sequence[str]) -> dict[str, str]:
    """The group (`near` or `far`) of each OOD set of the data `config` (the members' config)
    reads: the embedded sets' own (`study_data.OOD_GROUPS`), then `data.ood_groups`
    (`NAME=GROUP,...`); sets in neither have none.

    Raises:
      ValueError: an entry that is not `NAME=GROUP`, an unknown group or set.
    """
    data = config.get("data", {})
    embedded = data.get("source") == "embedded"
    groups = {n: OWN_GROUPS[n] for n in ood_sets if embedded and n in OWN_GROUPS}
    for entry in split_names(data.get("ood_groups", "")):
        name, sep, group = entry.partition("=")
        if not sep or group not in OOD_GROUPS:
            raise ValueError(f"data.ood_groups: {entry!r} is not NAME=near or NAME=far")
        if name not in ood_sets:
            raise ValueError(f"data.ood_groups names {name!r}, not an OOD set of {list(ood_sets)}")
        groups[name] = group
    return groups


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> OODDetection:
    s = settings
    return OODDetection(
        tuple(sets.ood), tuple(ood_scores(config)), sets.groups, s.knn_k, s.vim_dim, s.covariance
    )
