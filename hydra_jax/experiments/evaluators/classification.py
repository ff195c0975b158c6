"""Accuracy, calibration and member diversity on the ID test set."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections

from hydra_jax import metrics
from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import Predictions, Sets, Settings, pct


@dataclasses.dataclass(frozen=True)
class Classification:
    """Accuracy, NLL, Brier, ECE (equal-width bins), aECE, MCE, classwise ECE, entropy and, for
    ensembles, mutual information and member disagreement on the ID test set."""

    num_bins: int = 15
    key: ClassVar[str] = "id"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, float]:
        return metrics.classification(predictions.id.probs, predictions.id.labels, self.num_bins)

    def section(self, methods: dict[str, Any]) -> list[str]:
        lines = [
            "## In-distribution test set",
            "",
            "| method | acc % | NLL | Brier | ECE % | aECE % | MCE % | cwECE % | entropy | MI "
            "| disagreement |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in methods.items():
            m = r[self.key]
            diversity = ("mutual_information", "disagreement")
            extra = [f"{m[k]:.4f}" if k in m else "-" for k in diversity]
            cw = pct(m["cwece"]) if "cwece" in m else "-"  # results of an older evaluation
            lines.append(
                f"| {name} | {pct(m['acc'])} | {m['nll']:.4f} | {m['brier']:.4f} "
                f"| {pct(m['ece'])} | {pct(m['aece'])} | {pct(m['mce'])} | {cw} "
                f"| {m['entropy']:.4f} | {' | '.join(extra)} |"
            )
        return lines


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> Classification:
    del sets, config
    return Classification(settings.num_bins)
