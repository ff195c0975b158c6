"""The experiments behind `train.py` and `evaluate.py`, each a `train` and an `evaluate` stage.

| `experiment` | train | evaluate |
|---|---|---|
| `baselines` | fine-tune one classifier per seed | single / deep ensemble / MC dropout |
| `pruning` | head scores, HIES's alpha per ratio | pruning curves of the base model |
| `hydra` | member head sets, member fine-tuning, fusion | Hydras beside the baselines |
| `ablations` | members per ensemble size and head-set strategy | averaged vs per-member MLPs |
| `zero_shot` | a dual encoder (locked text), zero-shot member head sets | zero-shot Hydras |
| `custom` | your checkpoint on your data files: members, Hydras | every method named |

Each study's `train` produces every artefact (member checkpoints, head sets, fused Hydras,
scores) and its `evaluate` only loads them: no evaluate stage trains. The pieces they share:
`workdir` (ownership, the lock, process-0 writes, stage timings, results), `study_data` (the
embedded sets), `members` (seeds, head-set data, member fine-tuning), `artefacts` (what is
published and loaded back) and `evaluators` (the prediction loop and the metrics and report
sections of each method).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections

from hydra_jax.experiments import (
    ablations,
    artefacts,
    baselines,
    custom,
    evaluators,
    hydra,
    members,
    pruning,
    study_data,
    workdir,
    zero_shot,
)

Stage = Callable[[ml_collections.ConfigDict, "workdir.Workdir | Path"], Any]

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
    "EXPERIMENTS", "ablations", "artefacts", "baselines", "custom", "evaluators", "hydra",
    "members", "pruning", "stages", "study_data", "workdir", "zero_shot",
]  # fmt: skip
