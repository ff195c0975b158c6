"""A ViT trained from scratch on Fashion-MNIST; OOD: MNIST digits, 8x8 digits, photo patches.

The ViT (patch 4, so 49 patches and a CLS token; 4 layers of 12 heads of width 6; MLP 144;
dropout 0.1 on the residual stream, none on attention probabilities, as HF ViT's default: their
random bits cost more than the attention itself on a CPU) is trained with our training loop,
one per seed, and published as a HuggingFace `ViTForImageClassification` directory
(`WORKDIR/hf/member_M`, with `preprocessor_config.json`); evaluation and the pruning and Hydra
studies load those directories. Methods: `single` (member 0), `deep_ensemble` (3 ViTs, members
0..2), `mc_dropout` (the single ViT, 10 dropout samples), and the single-pass ensembles of 3
members: `batch_ensemble`, `packed_ensemble` (alpha 2, gamma 2) and `mimo` (the batch repeated
twice, half its rows shown to every member) trained from scratch as the members are,
`lora_ensemble` adapting the trained member 0 for one epoch; every method is also evaluated on
the first 2,000 test images under 4 corruptions at 3 severities.

A study seed S is the variant suffix `,S` (`configs/vit_fmnist.py:demo,1`): it offsets every
training seed by 1000 x S, so studies with seeds 0, 1, 2 share no model. Full run
(docs/results.md, "Vision"):

    python train.py --config configs/vit_fmnist.py --workdir runs/vit_fmnist
    python evaluate.py --config configs/vit_fmnist.py --workdir runs/vit_fmnist

`demo` variant (what `make demo` trains: 6,400 training images, 2 epochs; 400 test images,
200 of each OOD set, 100 shifted images per corruption and severity). `smoke` variant: a tiny
ViT (patch 7, 2 layers) on a few hundred images.
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant, _, seed = arg.partition(",")
    if variant not in ("", "demo", "smoke"):
        raise ValueError(f"unknown config variant {variant!r}; use '', 'demo' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "ViT from scratch on Fashion-MNIST"
    c.members_from = "scratch"  # trained from scratch: the ViT `model` describes
    c.seed = int(seed or 0)
    c.data_dir = ""  # "" = $HYDRA_JAX_DATA or ~/.cache/hydra_jax
    c.model = ml_collections.ConfigDict(
        dict(patch_size=4, width=72, layers=4, heads=12, mlp_dim=144, dropout=0.1,
             attention_dropout=0.0)
    )  # fmt: skip
    c.data = ml_collections.ConfigDict(
        dict(
            source="embedded",  # the study's own sets (`id_set`, `ood_sets`)
            id_set="fashion_mnist",
            ood_sets=("mnist", "digits", "photos"),
            corruptions=("gaussian_noise", "blur", "contrast", "rotation"),
            train_limit=0,  # 0 = the whole split
            eval_limit=0,  # caps every test set
            ood_limit=0,  # caps the OOD test sets only
            shift_limit=2000,  # the shifted sets: the first 2,000 test images, corrupted
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            epochs=16.0,
            batch_size=128,
            learning_rate=2e-3,
            warmup_fraction=0.05,
            weight_decay=0.05,
            max_grad_norm=1.0,
            checkpoint_every=500,
            log_every=100,
        )
    )
    c.methods = ("single", "deep_ensemble", "mc_dropout", "batch_ensemble", "lora_ensemble",
                 "packed_ensemble", "mimo")  # fmt: skip
    c.ensemble_size = 3
    c.mc_dropout_samples = 10
    # The single-pass ensembles (`ensemble_size` members); `train`: overrides of `c.train`.
    # BatchEnsemble, Packed-Ensembles and MIMO train from scratch like the members; the
    # LoRA-Ensemble adapts the trained member 0 (rank 8 on q, k, v, out; a head per member), for
    # 1 epoch.
    c.batch_ensemble = ml_collections.ConfigDict(dict(factor_std=0.5, train=dict()))
    c.lora_ensemble = ml_collections.ConfigDict(
        dict(rank=8, alpha=16.0, targets="query,key,value,out", train=dict(epochs=1.0))
    )
    c.packed_ensemble = ml_collections.ConfigDict(dict(alpha=2.0, groups=2, train=dict()))
    # MIMO: each step shows the batch twice (`repetitions`), every member its own order except
    # on a share `input_repetition` of the rows, where all members see one image.
    c.mimo = ml_collections.ConfigDict(dict(repetitions=2, input_repetition=0.5, train=dict()))
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
        c.data.update(train_limit=6400, eval_limit=400, ood_limit=200, shift_limit=100)
        c.eval.latency_repeats = 3
        c.train.epochs = 2.0
    if variant == "smoke":
        c.title += " (smoke)"
        c.model.update(patch_size=7, layers=2, width=24, heads=6, mlp_dim=48)
        c.data.update(train_limit=256, eval_limit=64, ood_limit=48, shift_limit=32)
        c.train.update(epochs=2.0, batch_size=32, learning_rate=1e-3, checkpoint_every=8,
                       log_every=4)  # fmt: skip
        c.mc_dropout_samples = 3
        c.packed_ensemble.alpha = 3.0  # member width 24 * 3 / 3: a multiple of 2 groups x 6 heads
        c.eval.update(batch_size=32, latency_batch=8, latency_repeats=3)
    if c.seed:
        c.title += f", study seed {c.seed}"
    # The device mesh the run is laid out on (docs/scale.md); it changes no result.
    c.mesh = ml_collections.ConfigDict(dict(data=1, member=1, heads=1))
    # How the run holds its workdir against a second run: "flock" (the file system's lock),
    # or "none" on a file system without locks, where you keep other runs off it.
    c.workdir_lock = "flock"
    c.lock()
    return c
