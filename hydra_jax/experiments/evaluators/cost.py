"""Parameters, FLOPs and latency of each method."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections
import numpy as np

from hydra_jax.evaluation import Method, cost
from hydra_jax.experiments.evaluators.base import Predictions, Sets, Settings
from hydra_jax.experiments.study_data import latency_batch


@dataclasses.dataclass(frozen=True)
class Cost:
    """Parameters, XLA FLOPs per example and the median latency of one fixed batch."""

    batch: dict[str, np.ndarray] = dataclasses.field(hash=False, compare=False)
    repeats: int = 10
    key: ClassVar[str] = "cost"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method | None) -> dict[str, float]:
        assert method is not None, "cost measures the method itself"
        return cost(method, self.batch, self.repeats)

    def section(self, methods: dict[str, Any]) -> list[str]:
        lines = [
            "",
            "## Cost (CPU, fp32; latency of one batch, median)",
            "",
            "| method | params | GFLOPs / example | latency ms | examples / s |",
            "|---|---|---|---|---|",
        ]
        for name, r in methods.items():
            c = r[self.key]
            lines.append(
                f"| {name} | {c['params']:,} | {c['flops_per_example'] / 1e9:.4g} | "
                f"{c['latency_ms']:.1f} | {c['examples_per_s']:.1f} |"
            )
        return lines


def build(settings: Settings, sets: Sets, config: ml_collections.ConfigDict) -> Cost:
    del settings
    return Cost(latency_batch(config, sets.test), config.eval.latency_repeats)
