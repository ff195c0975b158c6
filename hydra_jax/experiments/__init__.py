"""The experiments behind `train.py` and `evaluate.py`, each a `train` and an `evaluate` stage.

| `experiment` | train | evaluate |
|---|---|---|
| `study` | members, Hydras, single-pass ensembles: what the methods name | every method named |
| `pruning` | head scores, HIES's alpha per ratio | pruning curves of the base model |
| `ablations` | members per ensemble size and head-set strategy | averaged vs per-member MLPs |
| `zero_shot` | a dual encoder (locked text), the engine's Hydras | seen vs held-out classes too |

`study` (the `engine` module) runs every study whose rows are methods: the baselines, the
Hydra tables and your checkpoint on your files are configs of it (`configs/minilm_mr.py`,
`hydra_minilm_mr.py`, `vit_fmnist.py`, `hydra_vit_fmnist.py`, `custom.py`). Each `train`
produces every artefact (member checkpoints, head sets, fused Hydras, scores) and its `evaluate`
only loads them: no evaluate stage trains. The pieces they share: `workdir` (ownership, the
lock, process-0 writes, stage timings, results), `study_data` (the embedded sets),
`user_files` (your files), `members` (seeds, head-set data, member fine-tuning), `methods` (the
registry of methods), `artefacts` (what is published and loaded back) and `evaluators` (the
prediction loop and the metrics and report sections of each method).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections

from hydra_jax.experiments import (
    ablations,
    artefacts,
    engine,
    evaluators,
    members,
    methods,
    pruning,
    study_data,
    user_files,
    workdir,
    zero_shot,
)

Stage = Callable[[ml_collections.ConfigDict, "workdir.Workdir | Path"], Any]

EXPERIMENTS: dict[str, tuple[Stage, Stage]] = {
    "study": (engine.train, engine.evaluate),
    "pruning": (pruning.train, pruning.evaluate),
    "ablations": (ablations.train, ablations.evaluate),
    "zero_shot": (zero_shot.train, zero_shot.evaluate),
}


def stages(config: ml_collections.ConfigDict) -> tuple[Stage, Stage]:
    """`(train, evaluate)` of `config.experiment`."""
    if config.experiment not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {config.experiment!r}; known: {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[config.experiment]


__all__ = [
    "EXPERIMENTS", "ablations", "artefacts", "engine", "evaluators", "members", "methods",
    "pruning", "stages", "study_data", "user_files", "workdir", "zero_shot",
]  # fmt: skip
