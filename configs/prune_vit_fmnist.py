"""Pruning curves of the Fashion-MNIST ViT (member 0 of configs/vit_fmnist.py), no fine-tuning.

Criteria random (3 seeds), l2, his, ad, hies; 0..70% of the 72 heads removed (global top-k);
scores from 64 training images; HIES alpha chosen per ratio on the validation split from
{0, 0.1, ..., 0.9}. OOD AUROC on 1,000 images of each OOD test set.

    python train.py    --config configs/prune_vit_fmnist.py --workdir runs/prune_vit_fmnist
    python evaluate.py --config configs/prune_vit_fmnist.py --workdir runs/prune_vit_fmnist

`demo` (on the demo ViT, runs/demo_vit) and `smoke` (on runs/smoke_vit) variants.
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    if arg not in ("", "demo", "smoke"):
        raise ValueError(f"unknown config variant {arg!r}; use '', 'demo' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "Head pruning curves: ViT on Fashion-MNIST"
    c.members_from = "workdir"  # the members `base_workdir` trained
    c.base_workdir = "runs/vit_fmnist"
    c.calibration_size = 64
    c.calibration_seed = 0
    c.methods = ()  # no rows of methods: the study is its analysis
    c.analyses = ("pruning_curves",)
    # Criteria (random over its seeds), the fractions of heads removed, HIES alphas to choose from.
    c.pruning_curves = ml_collections.ConfigDict(
        dict(
            ratios=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
            criteria=("random", "l2", "his", "ad", "hies"),
            random_seeds=(0, 1, 2),
            alphas=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
        )
    )
    c.data = ml_collections.ConfigDict(dict(ood_limit=1000))  # OOD sets: a fixed random subset
    c.eval = ml_collections.ConfigDict(dict(batch_size=256))
    if arg == "demo":
        c.title += " (demo)"
        c.base_workdir = "runs/demo_vit"
    if arg == "smoke":
        c.title += " (smoke)"
        c.base_workdir = "runs/smoke_vit"
        c.calibration_size = 16
        c.data.ood_limit = 48
        c.eval.batch_size = 32
        c.pruning_curves.update(ratios=(0.0, 0.3, 0.6), random_seeds=(0, 1), alphas=(0.0, 0.5))
    # The device mesh the run is laid out on (docs/scale.md); it changes no result.
    c.mesh = ml_collections.ConfigDict(dict(data=1, member=1, heads=1))
    # How the run holds its workdir against a second run: "flock" (the file system's lock),
    # or "none" on a file system without locks, where you keep other runs off it.
    c.workdir_lock = "flock"
    c.lock()
    return c
