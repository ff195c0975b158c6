"""Analyses: a study's work on its member 0 beyond the rows of its methods.

A study config lists its analyses by name (`analyses`: `pruning_curves`, `ablations`; the
registry is `plan.ANALYSES`). Each is three functions over one `Context`: `check` refuses
bad settings before the workdir is claimed, `train` writes its artefacts in the workdir (scores,
fine-tuned members), `evaluate` only reads them and returns its part of `results.json` (top-level
keys of its own) and its section of `report.md`. The engine loads the members and the data,
owns the workdir and writes `results.json` and `report.md`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import ml_collections

from hydra_jax.experiments.workdir import Workdir
from hydra_jax.models import Model

if TYPE_CHECKING:  # the engine imports the analyses
    from hydra_jax.experiments.engine import Data, Plan


@dataclasses.dataclass(frozen=True)
class Context:
    """What an analysis works on: the study's `config` and `workdir`, its `plan` (where the
    members are, their config and the Hydra members' training settings), member 0 (`single`)
    and the data the members were trained on."""

    config: ml_collections.ConfigDict
    workdir: Workdir
    plan: Plan
    single: Model
    data: Data


def no_check(context: Context) -> None:
    del context


class Analysis(NamedTuple):
    """`check(context)` raises ValueError on settings that cannot run; `train(context)` writes
    the artefacts; `evaluate(context)` returns `(results, report section)`."""

    train: Callable[[Context], None]
    evaluate: Callable[[Context], tuple[dict[str, Any], list[str]]]
    check: Callable[[Context], None] = no_check
