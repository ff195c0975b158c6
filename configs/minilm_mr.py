"""MiniLM-L6 fine-tuned on Rotten Tomatoes sentences; OOD: NYT editorials, tweets, Amazon reviews.

Methods: `single` (one fine-tuned model, seed 0), `deep_ensemble` (3 models, seeds 0..2, stacked
and run with vmap), `mc_dropout` (the single model with 10 dropout samples), and the
single-pass ensembles of 3 members fine-tuned from the checkpoint as one network:
`batch_ensemble` (BatchEnsemble, factors N(1, 0.5)) and `lora_ensemble` (LoRA-Ensemble, rank 8
on q, k, v, out, a frozen backbone, a head per member).

Full run (test accuracy about 80%, see docs/results.md; the three members took about 25 minutes
on 2 CPU cores, the two single-pass ensembles about 40 minutes each, 2.1-2.2 s a step):

    python train.py --config configs/minilm_mr.py --workdir runs/minilm_mr
    python evaluate.py --config configs/minilm_mr.py --workdir runs/minilm_mr

`demo` variant (what `make demo` trains; a fixed random 800 of the training sentences cut at
48 tokens (4% are longer), one epoch of fine-tuning (25 steps); 200 ID test sentences and 100 of
each OOD test set):

    python train.py --config configs/minilm_mr.py:demo --workdir runs/demo_baselines

A study seed S is the suffix `,S` (`configs/minilm_mr.py:demo,1`): every training seed is
offset by 1000 x S.

Smoke run (real data cut to a few hundred sentences, a few steps; about 4 minutes on 2 cores):

    python train.py --config configs/minilm_mr.py:smoke --workdir runs/smoke
    python evaluate.py --config configs/minilm_mr.py:smoke --workdir runs/smoke
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant, _, seed = arg.partition(",")
    if variant not in ("", "demo", "smoke"):
        raise ValueError(f"unknown config variant {variant!r}; use '', 'demo' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "MiniLM-L6 on Rotten Tomatoes sentences"
    c.members_from = "checkpoint"  # fine-tuned from `checkpoint`
    c.seed = int(seed or 0)  # the study seed: every training seed is offset by 1000 * seed
    c.checkpoint = ""  # a local HF directory; "" = the embedded all-MiniLM-L6-v2
    c.data_dir = ""  # "" = $HYDRA_JAX_DATA or ~/.cache/hydra_jax
    c.data = ml_collections.ConfigDict(
        dict(
            source="embedded",  # the study's own sets (`id_set`, `ood_sets`)
            id_set="movie_reviews",
            ood_sets=("nyt_editorials", "tweets", "amazon_reviews"),
            max_tokens=64,
            train_limit=0,  # 0 = the whole split
            eval_limit=0,  # caps every test set
            ood_limit=0,  # caps the OOD test sets only
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            epochs=3.0,
            batch_size=32,
            learning_rate=1e-4,
            warmup_fraction=0.1,
            weight_decay=0.01,
            max_grad_norm=1.0,
            checkpoint_every=200,
            log_every=20,
        )
    )
    c.methods = ("single", "deep_ensemble", "mc_dropout", "batch_ensemble", "lora_ensemble")
    c.ensemble_size = 3
    c.mc_dropout_samples = 10
    # The single-pass ensembles (`ensemble_size` members); `train`: overrides of `c.train`.
    c.batch_ensemble = ml_collections.ConfigDict(dict(factor_std=0.5, train=dict()))
    # LoRA at 10x the members' full fine-tuning rate: its fresh heads, on a frozen backbone, stay
    # a chance-level classifier at the members' rate over the demo's few steps.
    c.lora_ensemble = ml_collections.ConfigDict(
        dict(rank=8, alpha=16.0, targets="query,key,value,out", train=dict(learning_rate=1e-3))
    )
    c.eval = ml_collections.ConfigDict(
        dict(batch_size=64, num_bins=15, latency_batch=32, latency_tokens=64, latency_repeats=10)
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
    if variant == "demo":  # `make demo`'s budget: see the module docstring
        c.title += " (demo)"
        c.train.epochs = 1.0
        c.data.update(max_tokens=48, train_limit=800, eval_limit=200, ood_limit=100)
        c.eval.latency_repeats = 3
    if variant == "smoke":
        c.title += " (smoke)"
        c.data.max_tokens = 32
        c.data.train_limit = 192
        c.data.eval_limit = 96
        c.train.update(
            epochs=1.0, batch_size=16, learning_rate=1e-4, checkpoint_every=6, log_every=4
        )
        c.mc_dropout_samples = 3
        c.eval.update(batch_size=32, latency_batch=8, latency_tokens=32, latency_repeats=3)
    if c.seed:
        c.title += f", study seed {c.seed}"
    # The device mesh the run is laid out on (docs/scale.md); it changes no result.
    c.mesh = ml_collections.ConfigDict(dict(data=1, member=1, heads=1))
    # How the run holds its workdir against a second run: "flock" (the file system's lock),
    # or "none" on a file system without locks, where you keep other runs off it.
    c.workdir_lock = "flock"
    c.lock()
    return c
