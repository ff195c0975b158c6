"""Zero-shot Hydra on a dual encoder: circuits in the vision tower, fused with no training.

`train(config, workdir)`:
  1. a `VisionTextDualEncoderModel` (a ViT from scratch, the real all-MiniLM-L6-v2 as the text
     tower, locked) trained contrastively on the Fashion-MNIST classes not held out, with
     captions from `config.templates`; published as an HF directory `workdir/hf/dual_encoder`
     (with MiniLM's tokenizer files and the image processor's config);
  2. from that directory, `hj.zero_shot` over all classes (prompt ensembles of the same
     templates), and member head sets: `circuit` (HeadMap search, member m with objective
     `circuit.objectives[m]` on its own uncertainty-validation subset) and `taylor` (HIS on its
     own calibration subset). Validation and calibration images come from the seen classes only,
     so nothing about a held-out class reaches the model, not even through head selection.
`evaluate(config, workdir)`: `single` (the zero-shot classifier), `pruned_circuit` (member 0 of
the circuit Hydra alone: the single circuit, our CircAvg), `hydra_taylor`, `hydra_circuit`
(members fused, no training); the usual metrics and costs, then accuracy, NLL and ECE on the
seen and held-out classes separately, and misclassification detection (wrong = positive).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import ml_collections
import numpy as np

from hydra_jax import ensembles, metrics
from hydra_jax.convert import from_pretrained
from hydra_jax.data import TextEncoder
from hydra_jax.evaluation import Method, logits_forward
from hydra_jax.experiments import artefacts, members, study_data
from hydra_jax.experiments.evaluators import evaluate_methods
from hydra_jax.experiments.members import training_seed
from hydra_jax.experiments.workdir import Workdir
from hydra_jax.models import DualEncoderConfig, Model, prompts, with_dtype, zero_shot
from hydra_jax.training import TrainSettings, fit, locked_text_contrastive_loss

# Fashion-MNIST's classes as captions name them (label order of the dataset).
CLASS_NAMES = (
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
)  # fmt: skip
STRATEGIES = ("taylor", "circuit")


def hf_dir(workdir: Path) -> Path:
    return Path(workdir) / "hf" / "dual_encoder"


def seen_classes(config: ml_collections.ConfigDict) -> np.ndarray:
    unknown = sorted(set(config.held_out) - set(CLASS_NAMES))
    if unknown:
        raise ValueError(f"held_out names unknown classes {unknown}; classes: {CLASS_NAMES}")
    return np.array([i for i, n in enumerate(CLASS_NAMES) if n not in config.held_out])


def only_seen(config: ml_collections.ConfigDict, dataset: Any) -> Any:
    return dataset.take(np.nonzero(np.isin(dataset.labels, seen_classes(config)))[0])


def initial_model(config: ml_collections.ConfigDict) -> Model:
    """A random ViT and projections beside the real MiniLM text tower (its pooler included)."""
    text = artefacts.base_model(config)
    vision = dataclasses.replace(artefacts.scratch_config(config), pooler=True, num_labels=0)
    dual = DualEncoderConfig(vision, dataclasses.replace(text.config, num_labels=0),
                             config.projection_dim)  # fmt: skip
    fresh = Model.init(dual, jax.random.key(training_seed(config, 0)))
    return Model(dual, {**fresh.params, "text_model": text.params})


def text_features(model: Model, encoder: TextEncoder, templates: Any) -> np.ndarray:
    """The locked text tower's pooled outputs of every caption `[C, P, D_text]`."""
    captions = prompts(CLASS_NAMES, templates)
    pooled = model.apply(model.params, **encoder.pad(captions)).text_model_output.pooler_output
    return np.asarray(pooled).reshape(len(CLASS_NAMES), len(templates), -1)


def classifier(config: ml_collections.ConfigDict, workdir: Path) -> Model:
    """The published dual encoder as a zero-shot classifier over every class."""
    path = hf_dir(workdir)
    encoder = TextEncoder(path, config.data.max_tokens)
    return zero_shot(from_pretrained(path), CLASS_NAMES, config.templates, encoder.pad)


def train(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, Any]:
    """Trains and publishes the dual encoder (resuming), then finds the member head sets."""
    workdir = Workdir.of(workdir)
    settings = TrainSettings(**config.train.to_dict(), seed=training_seed(config, 0))
    unknown = sorted(set(config.methods) - set(METHODS))
    if unknown:  # before the dual encoder trains, not at evaluation
        raise ValueError(f"unknown zero-shot methods {unknown}; known: {list(METHODS)}")
    workdir.claim(config)
    if not (hf_dir(workdir.path) / "config.json").is_file():
        with workdir.stage("train dual encoder"):
            model = initial_model(config)
            encoder = study_data.text_encoder(config)
            features = text_features(model, encoder, config.templates)
            train_set = only_seen(config, study_data.load_split(
                config, config.data.id_set, "train", config.data.train_limit))  # fmt: skip
            trained = fit(model, train_set, settings, workdir / "training",
                          loss=locked_text_contrastive_loss(model, features),
                          trainable=lambda path: path[0] != "text_model")  # fmt: skip
            # The text tower's own tokenizer travels with it, and our images' processor.
            artefacts.publish(trained, hf_dir(workdir.path), our_pixels=True,
                              files_from=study_data.checkpoint_dir(config))  # fmt: skip
    single = classifier(config, workdir.path)
    id_val, ood_val = study_data.validation_sets(config)
    id_val = only_seen(config, id_val)
    seeds = members.member_seeds(config, config.num_members)
    record = {}
    for strategy in STRATEGIES:  # calibration and circuit search on seen-class images only
        with workdir.stage(f"{strategy}: head sets"):
            sets = members.head_sets(config, strategy, single, id_val, seeds,
                                     lambda: (id_val, ood_val))  # fmt: skip
        record[strategy] = sets.astype(int).tolist()
    workdir.write_json("head_sets.json", record)
    workdir.save_stages()
    return record


# The zero-shot study's methods (`methods` builds each; `train` refuses any other name).
METHODS = ("single", "pruned_circuit", "hydra_taylor", "hydra_circuit")


def methods(config: ml_collections.ConfigDict, workdir: Path) -> list[Method]:
    single = classifier(config, workdir)
    sets = json.loads((workdir / "head_sets.json").read_text())
    members = {s: ensembles.members_from(single, np.array(sets[s], bool)) for s in STRATEGIES}
    built = (single, members["circuit"][0], ensembles.fuse(members["taylor"]),
             ensembles.fuse(members["circuit"]))  # in the order of METHODS  # fmt: skip
    models = {n: with_dtype(m, config.eval.dtype) for n, m in zip(METHODS, built, strict=True)}
    return [Method(n, logits_forward(models[n]), models[n].params) for n in config.methods]


@dataclasses.dataclass(frozen=True)
class ZeroShot:
    """Accuracy, NLL and ECE on the seen and the held-out classes separately (`held_out`: a
    bool mask over the ID test set), and misclassification detection (wrong = positive)."""

    held_out: np.ndarray = dataclasses.field(hash=False, compare=False)
    names: tuple[str, ...] = ()  # the held-out classes, for the report
    key: ClassVar[str] = "zero_shot"

    def __call__(self, predictions: dict[str, np.ndarray], method: Method) -> dict[str, Any]:
        probs, labels, held = predictions["id_probs"], predictions["labels"], self.held_out
        return {
            "seen": metrics.classification(probs[~held], labels[~held]),
            "held_out": metrics.classification(probs[held], labels[held]),
            "misclassification": metrics.misclassification(probs, labels),
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        return markdown(methods, self.names)


def evaluate(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, Any]:
    workdir = Workdir.of(workdir)
    workdir.check(config)
    workdir.require(workdir / "head_sets.json", "head sets")
    with workdir.stage("load"):
        to_evaluate = methods(config, workdir.path)
        study = study_data.load_data(config)
    held_out = ~np.isin(study.test.labels, seen_classes(config))
    if held_out.all() or not held_out.any():
        raise ValueError("the ID test set needs images of both seen and held-out classes")
    zero_shot_split = ZeroShot(held_out, tuple(config.held_out))
    return evaluate_methods(config, workdir, to_evaluate, study, extra=[zero_shot_split])


def markdown(methods: dict[str, Any], held_out: Sequence[str]) -> list[str]:
    """The zero-shot tables: seen vs held-out classes, and misclassification detection."""
    held = ", ".join(held_out)
    lines = [
        "",
        f"## Zero-shot: seen classes vs held out ({held}; never in training)",
        "",
        "| method | seen acc % | seen NLL | seen ECE % | held-out acc % | held-out NLL "
        "| held-out ECE % |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in methods.items():
        s, h = r["zero_shot"]["seen"], r["zero_shot"]["held_out"]
        cells = [f"{100 * x['acc']:.2f} | {x['nll']:.4f} | {100 * x['ece']:.2f}" for x in (s, h)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "## Misclassification detection (MSP; wrong predictions are positive), ID test, %",
        "",
        "| method | AUROC | AUPR | FPR95 |",
        "|---|---|---|---|",
    ]
    for name, r in methods.items():
        m = r["zero_shot"]["misclassification"]
        lines.append(f"| {name} | {100 * m['auroc']:.2f} | {100 * m['aupr']:.2f} "
                     f"| {100 * m['fpr95']:.2f} |")  # fmt: skip
    return lines
