"""Ensembles of one pretrained model: Hydra fusion, member head-set strategies, baselines.

`hj.hydra` is this package: `hj.hydra.fuse(members)`. A fused model saves and loads like any
model (`hj.save_model`, `hj.load_model`).
"""

from hydra_jax.ensembles import baselines
from hydra_jax.ensembles.fusion import fuse, members_from, unfuse, with_shared_weights
from hydra_jax.ensembles.members import (
    STRATEGIES,
    circuit_head_sets,
    head_sets,
    hies_head_sets,
    stratified_head_sets,
    taylor_head_sets,
)

__all__ = [
    "STRATEGIES",
    "baselines",
    "circuit_head_sets",
    "fuse",
    "head_sets",
    "hies_head_sets",
    "members_from",
    "stratified_head_sets",
    "taylor_head_sets",
    "unfuse",
    "with_shared_weights",
]
