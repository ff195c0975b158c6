"""The studies behind `train.py` and `evaluate.py`: one engine, every study a config of it.

`engine.train` produces every artefact a study config asks for, and `engine.evaluate` only
loads them (no evaluate stage trains):

- `methods`: train makes the members, Hydras and single-pass ensembles they name; evaluate runs
  each method through the evaluators.
- `analyses`: `pruning_curves` (train scores the heads and chooses HIES's alpha per ratio;
  evaluate draws the curves) and `ablations` (train fine-tunes members per ensemble size and
  head-set strategy; evaluate compares averaged and per-member MLPs).
- `zero_shot`: member 0 is a dual encoder's zero-shot classifier (the dual encoder trained
  here from scratch where no checkpoint is given); evaluate adds seen vs held-out classes.

The paper studies (`configs/minilm_mr.py`, `hydra_*.py`, `vit_fmnist.py`, `prune_*.py`,
`ablate_vit_fmnist.py`, `zero_shot_fmnist.py`) and your checkpoint on your files
(`custom.py`) are configs of it. The pieces: `workdir` (ownership, the lock, the layout,
process-0 writes, stage timings, results), `migrations` (older recorded configs), `plan` (what
a config asks for, and its checks), `study_inputs` (the data and the checkpoint), `sources`
(where the members come from: the starting model, the data, member 0),
`study_data` (the embedded sets), `user_files` (your files), `members`
(seeds, head-set data, member fine-tuning), `dual_encoder` (a dual encoder trained here),
`methods` (the registry of methods), `artefacts` (what is published and loaded back),
`evaluators` (the prediction loop and the metrics and report sections of each method) and
`analyses` (the protocol of `pruning` and `ablations`).
"""

from __future__ import annotations

from hydra_jax import extras

extras.require_studies("hydra_jax.experiments")

# After the check: these modules import the studies extra's packages.
from hydra_jax.experiments import (  # noqa: E402
    ablations,
    analyses,
    artefacts,
    dual_encoder,
    engine,
    evaluators,
    members,
    methods,
    pruning,
    study_data,
    user_files,
    workdir,
)

__all__ = [
    "ablations",
    "analyses",
    "artefacts",
    "dual_encoder",
    "engine",
    "evaluators",
    "members",
    "methods",
    "pruning",
    "study_data",
    "user_files",
    "workdir",
]
