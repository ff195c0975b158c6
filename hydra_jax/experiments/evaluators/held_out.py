"""Zero-shot classifiers: seen vs held-out classes, and misclassification detection."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from hydra_jax import metrics
from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import Predictions, pct


@dataclasses.dataclass(frozen=True)
class HeldOutClasses:
    """Accuracy, NLL and ECE on the seen and the held-out classes separately (`held_out`: a
    bool mask over the ID test set), and misclassification detection (wrong = positive)."""

    held_out: np.ndarray = dataclasses.field(hash=False, compare=False)
    names: tuple[str, ...] = ()  # the held-out classes, for the report
    key: ClassVar[str] = "zero_shot"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, Any]:
        probs, labels, held = predictions.id.probs, predictions.id.labels, self.held_out
        return {
            "seen": metrics.classification(probs[~held], labels[~held]),
            "held_out": metrics.classification(probs[held], labels[held]),
            "misclassification": metrics.misclassification(probs, labels),
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        """Seen vs held-out classes, and misclassification detection."""
        held = ", ".join(self.names)
        lines = [
            "",
            f"## Zero-shot: seen classes vs held out ({held}; never in training)",
            "",
            "| method | seen acc % | seen NLL | seen ECE % | held-out acc % | held-out NLL "
            "| held-out ECE % |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in methods.items():
            s, h = r[self.key]["seen"], r[self.key]["held_out"]
            cells = [f"{pct(x['acc'])} | {x['nll']:.4f} | {pct(x['ece'])}" for x in (s, h)]
            lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
        lines += [
            "",
            "## Misclassification detection (MSP; wrong predictions are positive), ID test, %",
            "",
            "| method | AUROC | AUPR | FPR95 |",
            "|---|---|---|---|",
        ]
        for name, r in methods.items():
            m = r[self.key]["misclassification"]
            cells = [pct(m[k]) for k in ("auroc", "aupr", "fpr95")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return lines
