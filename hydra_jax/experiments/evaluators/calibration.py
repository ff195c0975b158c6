"""Temperature scaling, and the ID and shift metrics after it."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import Outputs, Predictions, Sets, Settings, pct
from hydra_jax.metrics import temperature
from hydra_jax.metrics.cache import fitted_once


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Temperature scaling (`metrics.temperature`: one temperature per method, shared by its
    members, fitted by NLL on the validation subset), and every ID and shift metric of
    `Classification` after it."""

    shift: tuple[str, ...] = ()
    num_bins: int = 15
    # The temperature by what it was fitted on (`metrics.cache.fitted_once`): scoring
    # resampled test sets (`hydra-jax compare`) fits nothing anew.
    fitted: dict[str, Any] = dataclasses.field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    key: ClassVar[str] = "calibration"
    needs: ClassVar[frozenset[str]] = frozenset({"validation"})

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, Any]:
        validation = predictions.validation
        assert validation is not None, "calibration needs the validation predictions"
        t = fitted_once(self.fitted, temperature.fit, validation.logits, validation.labels)

        def after(outputs: Outputs) -> dict[str, float]:
            probs = temperature.scaled(outputs.logits, t)
            return metrics.classification(probs, outputs.labels, self.num_bins)

        shifted = {n: after(predictions.shift[n]) for n in self.shift}
        return {"temperature": t, "id": after(predictions.id), "shift": shifted}

    def section(self, methods: dict[str, Any]) -> list[str]:
        """The fitted temperature, and NLL and ECEs before and after it (ID test set; the
        shifted sets' mean ECE where the study has them)."""
        shifted = bool(next(iter(methods.values()))[self.key]["shift"])
        lines = [
            "",
            "## Temperature scaling (one temperature per method, fitted by NLL on ID validation)",
            "",
            "Before -> after scaling, ID test set"
            + ("; shift: mean over the shifted sets." if shifted else "."),
            "",
            "| method | T | NLL | ECE % | aECE % | cwECE % | acc % |"
            + (" shift ECE % |" if shifted else ""),
            "|---|---|---|---|---|---|---|" + ("---|" if shifted else ""),
        ]
        for name, r in methods.items():
            before, c = r["id"], r[self.key]
            after = c["id"]
            cells = [f"{c['temperature']:.3f}", f"{before['nll']:.4f} -> {after['nll']:.4f}"]
            cells += [f"{pct(before[k])} -> {pct(after[k])}" for k in ("ece", "aece", "cwece")]
            cells.append(pct(after["acc"]))
            if shifted:
                mean = lambda res: float(np.mean([v["ece"] for v in res.values()]))  # noqa: E731
                cells.append(f"{pct(mean(r['shift']))} -> {pct(mean(c['shift']))}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return lines


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> Calibration:
    del config
    return Calibration(tuple(sets.shift), settings.num_bins)
