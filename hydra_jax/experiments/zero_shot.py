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
  3. the classifier and, per strategy, the fused Hydra and its member 0 saved as the study
     engine saves them (`zero_shot/`, `fused/S`, `pruned/S`; `engine.build_hydras`).
`evaluate(config, workdir)` (`engine.evaluate`): `single` (the zero-shot classifier),
`pruned_circuit` (member 0 of the circuit Hydra alone: the single circuit, our CircAvg),
`hydra_taylor`, `hydra_circuit` (members fused, no training); the usual metrics and costs, then
accuracy, NLL and ECE on the seen and held-out classes separately, and misclassification
detection (wrong = positive).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.convert import from_pretrained
from hydra_jax.convert.native import save_model
from hydra_jax.data import TextEncoder
from hydra_jax.evaluation import Method
from hydra_jax.experiments import artefacts, engine, study_data
from hydra_jax.experiments.members import training_seed
from hydra_jax.experiments.workdir import Workdir
from hydra_jax.models import DualEncoderConfig, Model, prompts, zero_shot
from hydra_jax.training import TrainSettings, fit, locked_text_contrastive_loss

# Fashion-MNIST's classes as captions name them (label order of the dataset).
CLASS_NAMES = (
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal", "shirt", "sneaker", "bag", "ankle boot",
)  # fmt: skip


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
    """Trains and publishes the dual encoder (resuming); saves its zero-shot classifier, then
    the member head sets and each strategy's fused Hydra and pruned member 0 (untrained)."""
    workdir = Workdir.of(workdir)
    settings = TrainSettings(**config.train.to_dict(), seed=training_seed(config, 0))
    unknown = sorted(set(config.methods) - set(METHODS))
    if unknown:  # before the dual encoder trains, not at evaluation
        raise ValueError(f"unknown zero-shot methods {unknown}; known: {list(METHODS)}")
    plan = dataclasses.replace(engine.Plan.of(config, workdir), zero_shot=True)
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
    save_model(single, artefacts.zero_shot_dir(workdir.path))
    id_val, ood_val = study_data.validation_sets(config)
    id_val = only_seen(config, id_val)  # calibration and circuit search: seen classes only
    record = engine.build_hydras(config, workdir, plan, single, id_val, lambda: (id_val, ood_val))
    workdir.write_json("head_sets.json", record)
    workdir.save_stages()
    return record


# The zero-shot study's methods (`train` refuses any other name).
METHODS = ("single", "pruned_circuit", "hydra_taylor", "hydra_circuit")


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
    """Every method from what `train` saved (`engine.evaluate`), with the seen vs held-out
    classes split (`ZeroShot`)."""

    def held_out_split(study: study_data.StudyData) -> list[ZeroShot]:
        held_out = ~np.isin(study.test.labels, seen_classes(config))
        if held_out.all() or not held_out.any():
            raise ValueError("the ID test set needs images of both seen and held-out classes")
        return [ZeroShot(held_out, tuple(config.held_out))]

    return engine.evaluate(config, workdir, extra=held_out_split)


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
