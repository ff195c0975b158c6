"""Zero-shot Hydra on a ViT-MiniLM dual encoder trained here on 7 Fashion-MNIST classes.

No CLIP or SigLIP weights are reachable from the package registries, so we build the closest
honest setting: a `VisionTextDualEncoderModel` whose text tower is the real all-MiniLM-L6-v2,
locked, and whose vision tower (the ViT of configs/vit_fmnist.py, 12 heads per layer, with a
pooler) and projections are trained contrastively on the 7 classes not held out, with captions
from the templates below. It is published as an HF directory, which the experiment reloads and
turns into a 10-way zero-shot classifier (prompt ensembles); members are circuits of its vision
tower (and, as the paper's warned-against variant, Taylor head sets), fused with no training.
OOD: MNIST digits, 8x8 digits, photo patches (as in the vision study).

    python train.py --config configs/zero_shot_fmnist.py --workdir runs/zero_shot_fmnist
    python evaluate.py --config configs/zero_shot_fmnist.py --workdir runs/zero_shot_fmnist

`demo` variant (`make demo`): 6,400 training images (those of seen classes), 2 epochs; 400 test
images, 200 of each OOD set; circuit search on 128 validation images per member. `smoke`: a tiny
ViT on a few hundred images. A study seed S is the suffix `,S`.
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant, _, seed = arg.partition(",")
    if variant not in ("", "demo", "smoke"):
        raise ValueError(f"unknown config variant {variant!r}; use '', 'demo' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "Zero-shot Hydra: ViT-MiniLM dual encoder on Fashion-MNIST"
    c.members_from = "scratch"  # the dual encoder's vision tower, `model`, trained here
    c.seed = int(seed or 0)
    c.checkpoint = ""  # the text tower: a local HF BERT directory; "" = all-MiniLM-L6-v2
    c.data_dir = ""
    c.model = ml_collections.ConfigDict(
        dict(patch_size=4, width=72, layers=4, heads=12, mlp_dim=144, dropout=0.1,
             attention_dropout=0.0)
    )  # fmt: skip
    c.projection_dim = 64
    # A zero-shot classifier (of the dual encoder trained here: `model` is a ViT to train from
    # scratch beside the locked text tower of `checkpoint`): prompts from the templates filled
    # with each class name, no classifier trained.
    c.zero_shot = ml_collections.ConfigDict(
        dict(
            enabled=True,
            templates=(
                "a photo of a {}.", "a black and white photo of a {}.",
                "a low resolution photo of a {}.", "a grayscale photo of a {}.",
                "a product photo of a {}.", "a small photo of the {}.",
            ),
            # Never seen in training, nor in head selection.
            held_out=("trouser", "sandal", "bag"),
        )
    )  # fmt: skip
    c.data = ml_collections.ConfigDict(
        dict(
            source="embedded",  # the study's own sets (`id_set`, `ood_sets`)
            id_set="fashion_mnist",
            ood_sets=("mnist", "digits", "photos"),
            corruptions=(),  # no shifted sets in this study
            max_tokens=32,  # captions are short
            train_limit=0,
            eval_limit=0,
            ood_limit=0,
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(epochs=4.0, batch_size=128, learning_rate=2e-3, warmup_fraction=0.05,
             weight_decay=0.05, max_grad_norm=1.0, checkpoint_every=500, log_every=50)
    )  # fmt: skip
    c.num_members = 3
    c.calibration_size = 256  # Taylor: member m's random subset of seen-class validation images
    c.circuit = ml_collections.ConfigDict(
        dict(examples=512, objectives=("nll", "auroc", "avg"))  # member m: objectives[m]
    )
    c.methods = ("single", "pruned_circuit", "hydra_taylor", "hydra_circuit")
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
        c.data.update(train_limit=6400, eval_limit=400, ood_limit=200)
        c.train.epochs = 2.0
        c.circuit.examples = 128
        c.eval.latency_repeats = 3
    if variant == "smoke":
        c.title += " (smoke)"
        c.model.update(patch_size=7, layers=2, width=24, heads=6, mlp_dim=48)
        c.data.update(train_limit=256, eval_limit=96, ood_limit=48)
        c.train.update(epochs=2.0, batch_size=32, learning_rate=1e-3, checkpoint_every=8,
                       log_every=4)  # fmt: skip
        c.calibration_size = 16
        c.circuit.examples = 32
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
