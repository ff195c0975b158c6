"""Selective classification by the member-mean confidence."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections
import numpy as np

from hydra_jax.evaluation import Method
from hydra_jax.experiments.evaluators.base import Predictions, Sets, Settings, pct
from hydra_jax.metrics import selective


@dataclasses.dataclass(frozen=True)
class Selective:
    """Selective classification by the member-mean confidence (max_c p_c) on the ID test set:
    AURC, AUGRC and the selective risk at 80, 90 and 95% coverage (`metrics.selective`)."""

    key: ClassVar[str] = "selective"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, float]:
        p = predictions.id.probs.astype(np.float64).mean(1)
        return selective.selective(p.max(-1), p.argmax(-1) == predictions.id.labels)

    def section(self, methods: dict[str, Any]) -> list[str]:
        lines = [
            "",
            "## Selective classification (member-mean confidence; ID test set), %",
            "",
            "| method | AURC | AUGRC | risk at 80% | risk at 90% | risk at 95% |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in methods.items():
            s = r[self.key]
            keys = ("aurc", "augrc", "risk_80", "risk_90", "risk_95")
            lines.append(f"| {name} | " + " | ".join(pct(s[k]) for k in keys) + " |")
        return lines


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> Selective:
    del settings, sets, config
    return Selective()
