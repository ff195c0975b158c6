"""Hydra ablations on the Fashion-MNIST ViT (member 0 of configs/vit_fmnist.py): ensemble size M
in {2, 3, 4, 6} (12 / M heads per member), overlapping (taylor) vs disjoint (stratified) head
sets with their measured overlap, averaged vs per-member MLPs, and member disagreement before
and after fusion (the `ablations` analysis, hydra_jax/experiments/ablations.py). Members are
fine-tuned for one epoch on a fixed 10,000 training images; evaluated on a fixed 2,000 of the
test images and 1,000 images of each OOD test set.

    python train.py --config configs/ablate_vit_fmnist.py --workdir runs/ablate_vit_fmnist
    python evaluate.py --config configs/ablate_vit_fmnist.py --workdir runs/ablate_vit_fmnist

`demo` (on runs/demo_vit) and `smoke` (on runs/smoke_vit) variants.
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in ("", "demo", "smoke"):
        raise ValueError(f"unknown config variant {arg!r}; use '', 'demo' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "Hydra ablations: ViT on Fashion-MNIST"
    c.members_from = "workdir"  # the members `base_workdir` trained
    c.base_workdir = "runs/vit_fmnist"
    c.methods = ()  # no rows of methods: the study is its analysis
    c.analyses = ("ablations",)
    c.ablations = ml_collections.ConfigDict(
        dict(sizes=(2, 3, 4, 6), strategies=("taylor", "stratified"))
    )
    c.calibration_size = 256  # Taylor: member m's random training subset
    c.hies_alphas = (0.5,)  # read by the shared head-set code only for `hies`
    c.circuit = ml_collections.ConfigDict(dict(examples=256, objectives=("nll",)))
    c.member_train = ml_collections.ConfigDict(
        dict(epochs=1.0, learning_rate=5e-4, warmup_fraction=0.1)
    )
    c.data = ml_collections.ConfigDict(
        dict(
            train_limit=10000,  # member fine-tuning: a fixed random subset (seed 0)
            eval_limit=2000,  # a fixed random subset (seed 0) of the ID test set
            ood_limit=1000,
        )
    )
    c.eval = ml_collections.ConfigDict(dict(batch_size=256, num_bins=15, latency_batch=64))
    if arg == "demo":
        c.title += " (demo)"
        c.base_workdir = "runs/demo_vit"
        c.data.train_limit = 5000
    if arg == "smoke":
        c.title += " (smoke)"
        c.base_workdir = "runs/smoke_vit"
        c.ablations.sizes = (2, 3)
        c.calibration_size = 16
        c.data.update(train_limit=64, eval_limit=40, ood_limit=48)
        c.eval.update(batch_size=32, latency_batch=8)
    # The device mesh the run is laid out on (docs/scale.md); it changes no result.
    c.mesh = ml_collections.ConfigDict(dict(data=1, member=1, heads=1))
    # How the run holds its workdir against a second run: "flock" (the file system's lock),
    # or "none" on a file system without locks, where you keep other runs off it.
    c.workdir_lock = "flock"
    c.lock()
    return c
