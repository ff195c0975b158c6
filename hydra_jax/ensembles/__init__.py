"""Ensembles of one pretrained model: Hydra fusion, member head-set strategies, baselines, and
the efficient ensembles the Hydra paper compares with (BatchEnsemble, LoRA-Ensemble,
Packed-Ensembles, MIMO).

`hj.hydra` is this package: `hj.hydra.fuse(members)`. A fused model or an efficient ensemble
saves and loads like any model (`hj.save_model`, `hj.load_model`).
"""

from hydra_jax.ensembles import baselines
from hydra_jax.ensembles.efficient import (
    batch_ensemble,
    lora_ensemble,
    mimo,
    packed_ensemble,
    parameter_count,
    trainable,
)
from hydra_jax.ensembles.fusion import fuse, members_from, unfuse, with_shared_weights
from hydra_jax.ensembles.members import (
    STRATEGIES,
    circuit_head_sets,
    head_sets,
    heads_per_member,
    hies_head_sets,
    stratified_head_sets,
    taylor_head_sets,
)

__all__ = [
    "STRATEGIES",
    "baselines",
    "batch_ensemble",
    "circuit_head_sets",
    "fuse",
    "head_sets",
    "heads_per_member",
    "hies_head_sets",
    "lora_ensemble",
    "members_from",
    "mimo",
    "packed_ensemble",
    "parameter_count",
    "stratified_head_sets",
    "taylor_head_sets",
    "trainable",
    "unfuse",
    "with_shared_weights",
]
