"""Your model, your data: single, Deep Ensemble, MC dropout, pruned models and Hydras on a local
checkpoint and your data files, with nothing but command-line fields.

    hydra-jax train    --config custom --workdir W \\
        --config.model=DIR                      # a local HF directory (encoder or classifier)
        --config.data.train=csv:train.csv       # csv: tsv: jsonl: parquet: folder: npz:
        --config.data.validation=csv:val.csv    #   tfds:NAME:SPLIT  hf:DIR[:SPLIT]
        --config.data.test=csv:test.csv
        --config.data.ood=news=jsonl:news.jsonl,reviews=csv:reviews.csv   # NAME=SPEC, commas
        --config.methods=single,deep_ensemble,mc_dropout,hydra_taylor,hydra_circuit
    hydra-jax evaluate --config custom --workdir W   (the same fields)

In a clone, `python train.py --config configs/custom.py ...` and `python evaluate.py ...` are the
same commands (configs/custom.py is this config).

Methods: `single`, `deep_ensemble`, `mc_dropout`, `hydra_S` and `pruned_S` for a strategy S
(`taylor`, `hies`, `circuit`, `stratified`), and the single-pass ensembles `batch_ensemble`
(BatchEnsemble: rank-1 factors on every dense layer, `batch_ensemble.factor_std`),
`lora_ensemble` (LoRA adapters of `lora_ensemble.rank` on a frozen backbone, member heads) and
`packed_ensemble` (Packed-Ensembles of the checkpoint's architecture, `packed_ensemble.alpha`
and `.groups`, trained from scratch: it cannot use the pretrained weights) and, for an image
classifier (ViT, DeiT, DINOv2), `mimo` (MIMO: one network of its architecture with M x the
input channels and classes, trained from scratch; `mimo.repetitions`,
`mimo.input_repetition`).

Text tables read the columns `data.text_column` (default `text`), `data.label_column` (`label`)
and, for sentence pairs, `data.pair_column`. Labels may be integers or strings (mapped through
the checkpoint's `id2label`, else sorted). Images are preprocessed by the checkpoint's
`preprocessor_config.json`. `hydra_circuit` / `pruned_circuit` search heads on
`data.validation` and `data.ood_validation` (`NAME=SPEC` list). TFDS sources are read from
`data_dir`/tfds (default `$HYDRA_JAX_DATA` or `~/.cache/hydra_jax`), prepared beforehand: nothing
is ever downloaded.

Zero-shot (`--config.zero_shot.enabled=True`, a CLIP, SigLIP or ViT-BERT dual encoder as
`config.model`, image data with named classes): `single` classifies by prompts
(`zero_shot.templates` filled with the class names), nothing trains, and `hydra_S` / `pruned_S`
are that classifier's pruned members fused as they are (the Hydra paper's zero-shot setting).
Classes named in `zero_shot.held_out` never reach training or head selection; the report gives
their accuracy apart from the seen classes'.

Analyses of member 0 beyond the methods' rows (`--config.analyses=pruning_curves,ablations`):
`pruning_curves`, one-shot head pruning by every criterion (random, l2, his, ad, hies) at 0..70%
of the heads, HIES's alpha chosen per ratio on `data.validation` (which it needs);
`ablations`, Hydra members of each size in `ablations.sizes` and head-set strategy in
`ablations.strategies`, fine-tuned and evaluated before and after fusion.

`smoke` variant (`--config custom:smoke`): every budget cut to about a minute on a small model
(one short epoch, 16 calibration examples; 3 members, as in the full variant).
"""

from __future__ import annotations

import ml_collections

from hydra_jax.experiments import evaluators, pruning

# What each field of the config means (`--config.FIELD=VALUE`); docs/custom_config.md is made
# from it and from `get_config()`'s defaults (`make tables`), and a test keeps the two in step.
HELP = {
    "title": "the report's title",
    "seed": "the study seed: every training seed is offset by 1000 x seed (`custom,1`)",
    "members_from": "where the members come from: `checkpoint` (fine-tuned from `model`)",
    "model": "a local HF directory: a pretrained encoder or a classifier of a supported family",
    "data_dir": "where `tfds:` sources are prepared; empty: $HYDRA_JAX_DATA or ~/.cache/hydra_jax",
    "data.source": "`files`: the splits below, each `KIND:LOCATION`",
    "data.train": "the training split, `KIND:LOCATION` (required)",
    "data.validation": "a validation split: circuit search, HIES's alpha in the pruning curves",
    "data.test": "the in-distribution test split (required)",
    "data.ood": "OOD test sets, `NAME=KIND:LOCATION` separated by commas",
    "data.shift": "shifted test sets, `NAME=KIND:LOCATION` separated by commas: labelled "
    "with the training set's classes, of any file kind; accuracy, NLL, ECE, calibration after "
    "temperature scaling and conformal coverage on each",
    "data.ood_validation": "OOD validation sets (`NAME=SPEC,...`): circuit search's OOD half",
    "data.text_column": "the text column of a text table",
    "data.pair_column": "a second text column: sentence pairs",
    "data.label_column": "the label column (integers or strings)",
    "data.max_tokens": "texts are cut to this many tokens",
    "data.train_limit": "the first N training examples only; 0: all",
    "data.eval_limit": "caps every test and validation set; 0: no cap",
    "data.ood_limit": "caps the OOD sets only; 0: no cap",
    "data.ood_groups": "each OOD set's group, `NAME=near` or `NAME=far`: per-group means",
    "data.cache": "a directory for preprocessed images, written once and read by later "
    "epochs, stages and runs; empty: images are decoded and preprocessed batch by batch",
    "data.skip_bad_images": "images that do not decode are left out (a pass that decodes every "
    "image before training) and listed in the report, instead of stopping the run",
    "train.epochs": "epochs of fine-tuning per member (fractions allowed)",
    "train.batch_size": "examples per step",
    "train.learning_rate": "AdamW's peak learning rate",
    "train.warmup_fraction": "share of the steps of linear warm-up, then linear decay",
    "train.weight_decay": "AdamW's weight decay",
    "train.max_grad_norm": "global gradient-norm clipping",
    "train.checkpoint_every": "steps between checkpoints (a killed run resumes from the last)",
    "train.log_every": "steps between `metrics.jsonl` and TensorBoard records",
    "train.steps_per_call": "training steps one compiled call runs, their batches in memory "
    "together: more train faster on a CPU; results change only within float32 rounding",
    "methods": "the methods to train and evaluate, comma-separated",
    "ensemble_size": "members of the Deep Ensemble and of each single-pass ensemble",
    "mc_dropout_samples": "forward passes of MC dropout",
    "batch_ensemble.factor_std": "BatchEnsemble's rank-1 factors are drawn from N(1, std)",
    "lora_ensemble.rank": "rank of each member's LoRA adapters",
    "lora_ensemble.alpha": "LoRA's scale numerator (the update is alpha / rank x B A)",
    "lora_ensemble.targets": "the adapted projections, comma-separated",
    "lora_ensemble.train.learning_rate": "LoRA-Ensemble's learning rate (overrides `train`)",
    "packed_ensemble.alpha": "Packed-Ensembles' width factor",
    "packed_ensemble.groups": "Packed-Ensembles' groups per member (gamma)",
    "packed_ensemble.train.learning_rate": "Packed-Ensembles' learning rate (overrides `train`)",
    "mimo.repetitions": "MIMO shows each batch this many times per step",
    "mimo.input_repetition": "MIMO's share of rows that every member sees alike",
    "mimo.train.learning_rate": "MIMO's learning rate (overrides `train`)",
    "num_members": "members of each Hydra; must divide the heads per layer",
    "member_train.epochs": "fine-tuning of each pruned Hydra member (overrides `train`)",
    "member_train.learning_rate": "its learning rate (overrides `train`)",
    "calibration_size": "training examples (a random subset per member) that head scores read",
    "hies_alphas": "HIES's alpha of each Hydra member; empty: (m + 1) / (M + 1) for member m",
    "circuit.examples": "ID and OOD validation examples of each member's circuit search",
    "circuit.objectives": "each member's circuit-search objective, one per member, cycled",
    "zero_shot.enabled": "member 0 is a dual encoder's zero-shot classifier; nothing trains",
    "zero_shot.templates": "prompt templates, `{}` replaced by each class name",
    "zero_shot.held_out": "class names kept out of training and head selection, reported apart",
    "analyses": "analyses of member 0, comma-separated: `pruning_curves`, `ablations`",
    "pruning_curves.ratios": "shares of the heads pruned, one point of the curves each",
    "pruning_curves.criteria": "the head-scoring criteria of the curves",
    "pruning_curves.random_seeds": "seeds of the `random` criterion, averaged",
    "pruning_curves.alphas": "HIES alphas to choose from, per ratio, on `data.validation`",
    "calibration_seed": "the seed of the analyses' calibration examples",
    "ablations.sizes": "Hydra sizes of the ablations; each must divide the heads per layer",
    "ablations.strategies": "head-set strategies of the ablations",
    "eval.batch_size": "examples per prediction batch",
    "eval.num_bins": "bins of ECE and the reliability plots",
    "eval.latency_batch": "batch of the latency measurement",
    "eval.latency_tokens": "tokens per example of the latency measurement (text)",
    "eval.latency_repeats": "timed calls of the latency measurement (median)",
    "eval.dtype": "compute dtype of every evaluated forward: `float32` or `bfloat16` (bf16 "
    "dense products, float32 hidden states)",
    "evaluators": "the evaluators, comma-separated (`classification`, `calibration`, "
    "`selective`, `conformal`, `ood`, `shift`, `cost`); empty: every one the data allow",
    "ood_scores": "OOD scores: `msp`, `entropy`, `mi`, `energy`, `max_logit`, `gen` and the "
    "detectors fitted on the training subset `mahalanobis`, `relative_mahalanobis`, `knn`, "
    "`vim`, `react`, `kl_matching`",
    "eval.alpha": "conformal sets' miscoverage: coverage 1 - alpha",
    "eval.raps_penalty": "RAPS's penalty per class ranked beyond `raps_k`",
    "eval.raps_k": "RAPS's classes without penalty",
    "eval.knn_k": "KNN detector's neighbour",
    "eval.vim_dim": "ViM's principal dimensions; 0: half the feature dimension",
    "eval.feature_fit_limit": "training examples the feature detectors fit on; 0: all",
    "eval.calibration_limit": "validation examples of temperature scaling and conformal; 0: all",
    "eval.features_dtype": "stored member features: `float32`, or `float16` for disk space "
    "(it moves the Mahalanobis detectors: docs/evaluation.md)",
    "eval.covariance": "the Mahalanobis detectors' covariance: `pinv` (the estimate's "
    "pseudo-inverse) or `ledoit_wolf` (shrunk first, for near-singular features)",
    "mesh.data": "devices along the batch axis",
    "mesh.member": "devices along the member axis (fused Hydras, stacked Deep Ensembles)",
    "mesh.heads": "devices along the attention-head axis",
    "workdir_lock": "how the run holds its workdir against a second run: flock (the file "
    "system's lock; refused, named, where the file system has none) or none (you keep other runs "
    "off it)",
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    variant, _, seed = arg.partition(",")
    if variant not in ("", "smoke"):
        raise ValueError(f"unknown config variant {variant!r}; use '' or 'smoke'")
    c = ml_collections.ConfigDict()
    c.title = "Your model on your data"
    c.seed = int(seed or 0)  # the study seed: every training seed is offset by 1000 * seed
    c.members_from = "checkpoint"  # fine-tuned from `model`
    c.model = ""  # a local HF directory: a pretrained encoder or a classifier
    c.data_dir = ""  # TFDS sources: "" = $HYDRA_JAX_DATA or ~/.cache/hydra_jax
    c.data = ml_collections.ConfigDict(
        dict(
            source="files",  # your files: the splits below
            train="",
            validation="",
            test="",
            ood="",  # NAME=SPEC,NAME=SPEC
            shift="",  # NAME=SPEC,...: shifted copies of the test set, labelled as it is
            ood_validation="",  # NAME=SPEC,...: circuit search's OOD half
            text_column="text",
            pair_column="",  # a second text column: sentence pairs
            label_column="label",
            max_tokens=128,
            train_limit=0,  # 0 = the whole split
            eval_limit=0,  # caps every test and validation set
            ood_limit=0,  # caps the OOD sets only
            ood_groups="",  # NAME=near,NAME=far: per-group OOD means
            cache="",  # a directory: preprocessed images written once, then read
            skip_bad_images=False,  # images that do not decode: left out and listed, not fatal
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            epochs=3.0,
            batch_size=32,
            learning_rate=5e-5,
            warmup_fraction=0.1,
            weight_decay=0.01,
            max_grad_norm=1.0,
            checkpoint_every=200,
            log_every=20,
            steps_per_call=8,
        )
    )
    c.methods = "single,deep_ensemble,mc_dropout,hydra_taylor"  # comma-separated
    c.ensemble_size = 3
    c.mc_dropout_samples = 10
    # Single-pass ensembles of `ensemble_size` members (methods batch_ensemble, lora_ensemble, ...);
    # `train` holds their overrides of `c.train`.
    c.batch_ensemble = ml_collections.ConfigDict(dict(factor_std=0.5, train=dict()))
    c.lora_ensemble = ml_collections.ConfigDict(
        dict(rank=8, alpha=16.0, targets="query,key,value,out", train=dict(learning_rate=5e-4))
    )
    # Packed-Ensembles: the checkpoint's architecture, trained from scratch (no pretrained start).
    c.packed_ensemble = ml_collections.ConfigDict(
        dict(alpha=2.0, groups=1, train=dict(learning_rate=5e-4))
    )
    # MIMO (images only): the checkpoint's architecture, trained from scratch; each step shows the
    # batch `repetitions` times, a share `input_repetition` of its rows the same to every member.
    c.mimo = ml_collections.ConfigDict(
        dict(repetitions=2, input_repetition=0.5, train=dict(learning_rate=5e-4))
    )
    # Hydra members: fine-tuning after pruning (fields not set here come from `train`).
    c.num_members = 3
    c.member_train = ml_collections.ConfigDict(dict(epochs=1.0, learning_rate=2e-5))
    c.calibration_size = 256  # head scores: member m's random training subset
    c.hies_alphas = ()  # one per member; empty: evenly spaced, (m + 1) / (M + 1)
    c.circuit = ml_collections.ConfigDict(dict(examples=256, objectives=("nll", "auroc", "avg")))
    # Zero-shot, on a dual encoder (CLIP, SigLIP, ViT-BERT) and images: classes named by the
    # templates filled with the class names (string labels, class folders); nothing trains and
    # the Hydra members are fused as pruned. Methods: single, pruned_S, hydra_S.
    # held_out: class names kept out of training and head selection, reported apart.
    c.zero_shot = ml_collections.ConfigDict(
        dict(enabled=False, templates=("a photo of a {}.",), held_out=())
    )
    # Analyses of member 0 (comma-separated; module docstring); their heads are scored on
    # `calibration_size` training examples drawn with `calibration_seed`.
    c.analyses = ""
    c.pruning_curves = pruning.default_config(smoke=variant == "smoke")
    c.calibration_seed = 0
    c.ablations = ml_collections.ConfigDict(
        dict(sizes=(2, 3, 4, 6), strategies=("taylor", "stratified"))
    )
    c.eval = ml_collections.ConfigDict(
        dict(batch_size=64, num_bins=15, latency_batch=32, latency_tokens=64, latency_repeats=10)
    )
    c.eval.dtype = "float32"
    # What the evaluation reports (`hydra_jax.experiments.evaluators`): evaluators and OOD
    # scores by name, and their settings (conformal alpha, detectors' fit subset, ...). No
    # evaluators named: every one the data allow (calibration and conformal: a validation split).
    c.evaluators = ""
    c.ood_scores = (
        "msp,entropy,mi,energy,max_logit,gen,mahalanobis,relative_mahalanobis,knn,vim,react,"
        "kl_matching"
    )
    c.eval.update(evaluators.eval_fields())
    c.mesh = ml_collections.ConfigDict(dict(data=1, member=1, heads=1))
    # How the run holds its workdir against a second run: "flock" (the file system's lock),
    # or "none" on a file system without locks, where you keep other runs off it.
    c.workdir_lock = "flock"
    if variant == "smoke":
        c.title += " (smoke)"
        c.data.max_tokens = 32
        c.train.update(epochs=1.0, batch_size=8, checkpoint_every=1000, log_every=5)
        c.mc_dropout_samples = 2
        c.member_train.epochs = 0.5
        c.calibration_size = 16
        c.circuit.update(examples=16, objectives=("nll", "avg"))
        c.ablations.sizes = (2,)
        c.eval.update(batch_size=16, latency_batch=4, latency_tokens=16, latency_repeats=1)
    return c
