"""A zero-shot study's dual encoder trained here, for when no CLIP or SigLIP weights are at hand.

A `VisionTextDualEncoderModel`: a ViT from scratch (`model`, with a pooler) and projections
(`projection_dim`) beside the text tower of `checkpoint` (a local BERT-family directory; "" =
the embedded all-MiniLM-L6-v2), locked. It is trained contrastively on the training images,
each against the captions of every class (`zero_shot.templates` filled with the class names),
and published as an HF directory (`hf/dual_encoder`) with the text tower's tokenizer files and
our images' processor, from which the engine builds the zero-shot classifier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from hydra_jax.data import Dataset, TextEncoder
from hydra_jax.experiments import artefacts, study_data
from hydra_jax.experiments.members import training_seed
from hydra_jax.experiments.workdir import Workdir, layout
from hydra_jax.models import DualEncoderConfig, Model, prompts
from hydra_jax.training import TrainSettings, fit, locked_text_contrastive_loss


def hf_dir(workdir: Path) -> Path:
    """Where the trained dual encoder is published."""
    return layout(workdir, "dual_encoder")


def initial_model(config: ml_collections.ConfigDict) -> Model:
    """A random ViT and projections beside the checkpoint's text tower (its pooler included)."""
    text = artefacts.base_model(config)
    vision = dataclasses.replace(artefacts.scratch_config(config), pooler=True, num_labels=0)
    dual = DualEncoderConfig(
        vision, dataclasses.replace(text.config, num_labels=0), config.projection_dim
    )
    fresh = Model.init(dual, jax.random.key(training_seed(config, 0)))
    return Model(dual, {**fresh.params, "text_model": text.params})


def text_features(
    model: Model, encoder: TextEncoder, classes: Sequence[str], templates: Sequence[str]
) -> np.ndarray:
    """The locked text tower's pooled outputs of every caption `[C, P, D_text]`."""
    captions = prompts(classes, templates)
    pooled = model.apply(model.params, **encoder.pad(captions)).text_model_output.pooler_output
    return np.asarray(pooled).reshape(len(classes), len(templates), -1)


def train(
    config: ml_collections.ConfigDict,
    workdir: Workdir,
    train_set: Dataset,
    classes: Sequence[str],
) -> Path:
    """Trains the dual encoder on `train_set` against the captions of `classes` and publishes
    it (a finished one is kept: training resumes from its checkpoints otherwise)."""
    path = hf_dir(workdir.path)
    if (path / "config.json").is_file():
        return path
    with workdir.stage("train dual encoder"):
        model = initial_model(config)
        features = text_features(
            model, study_data.text_encoder(config), classes, config.zero_shot.templates
        )
        settings = TrainSettings(**config.train.to_dict(), seed=training_seed(config, 0))
        trained = fit(
            model,
            train_set,
            settings,
            workdir / "training",
            loss=locked_text_contrastive_loss(model, features),
            trainable=lambda p: p[0] != "text_model",
        )
        # The text tower's own tokenizer travels with it, and our images' processor.
        artefacts.publish(
            trained, path, our_pixels=True, files_from=study_data.checkpoint_dir(config)
        )
    return path
