"""Accuracy, NLL and ECE under dataset shift."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import Predictions, Sets, Settings, pct


@dataclasses.dataclass(frozen=True)
class Shift:
    """Accuracy, NLL and ECE on each shifted copy of the ID test set: the embedded studies'
    corruptions (`CORRUPTION_SEVERITY`), or the generic study's `data.shift` sets."""

    names: tuple[str, ...]
    num_bins: int = 15
    key: ClassVar[str] = "shift"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, Any]:
        shifted = predictions.shift
        return {
            name: metrics.classification(shifted[name].probs, shifted[name].labels, self.num_bins)
            for name in self.names
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        shifts = list(next(iter(methods.values())).get(self.key, {}))
        if not shifts:
            return []
        lines = ["", "## Dataset shift (each shifted copy of the ID test set)"]
        for key, label, fmt in (
            ("acc", "accuracy %", pct),
            ("nll", "NLL", "{:.4f}".format),
            ("ece", "ECE %", pct),
        ):
            lines += ["", f"{label}:", "", "| method | " + " | ".join([*shifts, "mean"]) + " |"]
            lines += ["|---|" + "---|" * (len(shifts) + 1)]
            for name, r in methods.items():
                values = [r[self.key][s][key] for s in shifts]
                cells = [fmt(v) for v in [*values, float(np.mean(values))]]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return lines


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> Shift:
    del config
    return Shift(tuple(sets.shift), settings.num_bins)
