"""Hydra Ensembles of the Fashion-MNIST ViT, beside the uncertainty baselines, with shift.

From the published single ViT of configs/vit_fmnist.py (its workdir is `base_workdir`): 3
members keeping 4 of 12 heads per layer, chosen by each strategy (taylor, circuit, hies,
stratified), each member fine-tuned for one epoch, fused into one network. Methods: single,
deep_ensemble (3 ViTs trained from scratch), mc_dropout, the single-pass ensembles of the base
workdir (batch_ensemble, lora_ensemble, packed_ensemble, mimo), pruned_taylor, pruned_circuit
(one circuit-pruned member: our stand-in for the paper's CircAvg), pruned_hies and one hydra_*
per strategy; each on the ID test set, the three OOD sets and 12 shifted test sets.

    python train.py --config configs/hydra_vit_fmnist.py --workdir runs/hydra_vit_fmnist
    python evaluate.py --config configs/hydra_vit_fmnist.py --workdir runs/hydra_vit_fmnist

`demo` (on runs/demo_vit, the `demo` baselines): the paper's rows, single, deep_ensemble,
mc_dropout, the four single-pass ensembles, hydra_taylor, hydra_circuit. `smoke` (on
runs/smoke_vit). A study seed S is the variant suffix `,S` on both configs (e.g.
`configs/vit_fmnist.py:,1` and `configs/hydra_vit_fmnist.py:,1`), whose base workdir is
`runs/vit_fmnist_seed1`.
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant, _, seed = arg.partition(",")
    if variant not in ("", "demo", "smoke"):
        raise ValueError(f"unknown config variant {variant!r}; use '', 'demo' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "Hydra Ensembles: ViT on Fashion-MNIST"
    c.members_from = "workdir"  # the members `base_workdir` trained
    c.base_workdir = "runs/vit_fmnist"
    c.num_members = 3
    c.strategies = ("taylor", "circuit", "hies", "stratified")
    c.methods = (
        "single", "deep_ensemble", "mc_dropout", "batch_ensemble", "lora_ensemble",
        "packed_ensemble", "mimo", "pruned_taylor", "pruned_circuit", "pruned_hies",
        "hydra_taylor", "hydra_circuit", "hydra_hies", "hydra_stratified",
    )  # fmt: skip
    c.calibration_size = 256  # Taylor: member m's random training subset
    c.hies_alphas = (0.25, 0.5, 0.75)  # one per member
    c.circuit = ml_collections.ConfigDict(
        dict(examples=512, objectives=("nll", "auroc", "avg"))  # member m: objectives[m]
    )
    # Member fine-tuning; fields not set here come from the base config's `train`.
    c.member_train = ml_collections.ConfigDict(
        dict(epochs=1.0, learning_rate=5e-4, warmup_fraction=0.1)
    )
    c.fused_train = ml_collections.ConfigDict(dict(epochs=0.0, learning_rate=2e-4))
    c.eval = ml_collections.ConfigDict(
        dict(batch_size=256, num_bins=15, latency_batch=64, latency_repeats=10)
    )
    # Compute dtype of every evaluated forward pass ("bfloat16": docs/scale.md, "Precision").
    c.eval.dtype = "float32"
    # What the evaluation reports (docs/evaluation.md): evaluators and OOD
    # scores by name, and their settings (conformal alpha, detectors' fit subset, ...).
    c.evaluators = "classification,calibration,selective,conformal,ood,shift,cost"
    c.ood_scores = (
        "msp,entropy,mi,energy,max_logit,gen,mahalanobis,relative_mahalanobis,knn,vim,react,"
        "kl_matching"
    )
    c.eval.update(
        alpha=0.1, raps_penalty=0.01, raps_k=5, knn_k=50, vim_dim=0, feature_fit_limit=1000,
        calibration_limit=1000, features_dtype="float32", covariance="pinv",
    )  # fmt: skip
    if variant == "demo":
        c.title += " (demo)"
        c.base_workdir = "runs/demo_vit"
        c.strategies = ("taylor", "circuit")
        c.methods = ("single", "deep_ensemble", "mc_dropout", "batch_ensemble", "lora_ensemble",
                     "packed_ensemble", "mimo", "hydra_taylor", "hydra_circuit")  # fmt: skip
        c.circuit.examples = 128
        c.member_train.epochs = 0.5
        c.eval.latency_repeats = 3
    if variant == "smoke":
        c.title += " (smoke)"
        c.base_workdir = "runs/smoke_vit"
        c.calibration_size = 16
        c.hies_alphas = (0.3, 0.5, 0.7)  # one per member, as in the full variant
        c.circuit.examples = 32
        c.member_train.epochs = 0.5
        c.eval.update(batch_size=32, latency_batch=8, latency_repeats=3)
    if seed:
        c.title += f", study seed {seed}"
        c.base_workdir += f"_seed{seed}"
    # The device mesh the run is laid out on (docs/scale.md); it changes no result.
    c.mesh = ml_collections.ConfigDict(dict(data=1, member=1, heads=1))
    # How the run holds its workdir against a second run: "flock" (the file system's lock),
    # or "none" on a file system without locks, where you keep other runs off it.
    c.workdir_lock = "flock"
    c.lock()
    return c
