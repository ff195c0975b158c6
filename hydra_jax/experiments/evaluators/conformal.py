"""Split-conformal prediction sets: coverage and size."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections
import numpy as np

from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import Predictions, Sets, Settings, pct
from hydra_jax.metrics import conformal


@dataclasses.dataclass(frozen=True)
class Conformal:
    """Split-conformal sets (LAC, APS, RAPS; `metrics.conformal`) calibrated on the validation
    subset at `alpha`: coverage and mean set size on the ID test set and each shifted set."""

    shift: tuple[str, ...] = ()
    alpha: float = 0.1
    penalty: float = 0.01
    k_reg: int = 5
    key: ClassVar[str] = "conformal"
    needs: ClassVar[frozenset[str]] = frozenset({"validation"})

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, Any]:
        validation = predictions.validation
        assert validation is not None, "conformal needs the validation predictions"
        sets = {"test": (predictions.id.probs, predictions.id.labels)}
        sets |= {
            f"shift_{n}": (predictions.shift[n].probs, predictions.shift[n].labels)
            for n in self.shift
        }
        out: dict[str, Any] = {"alpha": self.alpha}
        for name in conformal.METHODS:
            out[name] = conformal.conformal(
                validation.probs, validation.labels, sets, name,  # type: ignore[arg-type]
                self.alpha, self.penalty, self.k_reg,
            )  # fmt: skip
        return out

    def section(self, methods: dict[str, Any]) -> list[str]:
        """Coverage and mean set size of LAC, APS and RAPS on the ID test set (and APS's mean
        over the shifted sets)."""
        first = next(iter(methods.values()))[self.key]
        shifts = [k for k in first["aps"] if k.startswith("shift_")]
        lines = [
            "",
            f"## Conformal prediction sets (split conformal on ID validation, alpha "
            f"{first['alpha']:g}): coverage % / mean set size",
            "",
            "| method | LAC | APS | RAPS |" + (" APS, shift mean |" if shifts else ""),
            "|---|---|---|---|" + ("---|" if shifts else ""),
        ]
        for name, r in methods.items():
            c = r[self.key]
            cells = [
                f"{pct(c[m]['test']['coverage'])} / {c[m]['test']['size']:.2f}"
                for m in ("lac", "aps", "raps")
            ]
            if shifts:
                coverage = np.mean([c["aps"][s]["coverage"] for s in shifts])
                size = np.mean([c["aps"][s]["size"] for s in shifts])
                cells.append(f"{pct(coverage)} / {size:.2f}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return lines


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> Conformal:
    del config
    s = settings
    return Conformal(tuple(sets.shift), s.alpha, s.raps_penalty, s.raps_k)
