"""The experiments behind `train.py` and `evaluate.py`, each a `train` and an `evaluate` stage.

| `experiment` | train | evaluate |
|---|---|---|
| `baselines` | fine-tune one classifier per seed | single / deep ensemble / MC dropout |
| `pruning` | nothing (checks the base run) | pruning curves of the base model |
| `hydra` | member head sets, member fine-tuning, fusion | Hydras beside the baselines |
| `ablations` | members per ensemble size and head-set strategy | averaged vs per-member MLPs |
| `zero_shot` | a dual encoder (locked text), zero-shot member head sets | zero-shot Hydras |
| `custom` | your checkpoint on your data files: members, Hydras | every method named |
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections

from hydra_jax.experiments import (
    ablations,
    baselines,
    common,
    custom,
    hydra,
    pruning,
    zero_shot,
)

Stage = Callable[[ml_collections.ConfigDict, Path], Any]

EXPERIMENTS: dict[str, tuple[Stage, Stage]] = {
    "baselines": (baselines.train, baselines.evaluate),
    "pruning": (pruning.train, pruning.evaluate),
    "hydra": (hydra.train, hydra.evaluate),
    "ablations": (ablations.train, ablations.evaluate),
    "zero_shot": (zero_shot.train, zero_shot.evaluate),
    "custom": (custom.train, custom.evaluate),
}


def stages(config: ml_collections.ConfigDict) -> tuple[Stage, Stage]:
    """`(train, evaluate)` of `config.experiment`."""
    if config.experiment not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {config.experiment!r}; known: {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[config.experiment]


__all__ = [
    "EXPERIMENTS", "ablations", "baselines", "common", "custom", "hydra", "pruning", "stages",
    "zero_shot",
]  # fmt: skip
