"""Where a study's members come from: one object that supplies the starting model, the data, the
set head scores calibrate on, and member 0.

The config says where (`members_from`): fine-tuned from a `checkpoint`, trained from `scratch`
(an architecture `model` describes), or read from the `workdir` that trained them
(`base_workdir`); with `zero_shot.enabled`, member 0 is a dual encoder's zero-shot classifier
(the checkpoint's, or one trained here from scratch) and no classifier trains. `Members.load`
reads what that takes, `Members.check` refuses (before anything trains) what the data and the
starting model decide, and `Members.member_zero` makes member 0 once the workdir is claimed.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import jax
import ml_collections

from hydra_jax import ensembles
from hydra_jax.convert import from_pretrained
from hydra_jax.convert.native import save_model
from hydra_jax.data import Dataset, TextEncoder
from hydra_jax.data.files import DataError
from hydra_jax.experiments import artefacts, dual_encoder, members
from hydra_jax.experiments.plan import (
    Plan,
    check_analyses_on,
    check_calibration,
    check_classes,
    check_single_pass,
    check_zero_shot,
)
from hydra_jax.experiments.study_inputs import Data, checkpoint, load_data
from hydra_jax.experiments.workdir import Workdir
from hydra_jax.models import Model, with_classifier, zero_shot
from hydra_jax.models.architectures import architecture


@dataclasses.dataclass
class Members:
    """A study's members' origin and data (the module docstring says which origins).

    Attributes:
      config: the study config.
      plan: what it asks for (`plan.Plan`).
      data: the sets the members train and are evaluated on.
      checkpoint: the HF directory the members (or the zero-shot classifier) start from; None
        from scratch or from a workdir.
      base: that checkpoint's model, or None.
      single: member 0 where it exists before training (a workdir's published member 0, or a
        checkpoint's zero-shot classifier), else None.
    """

    config: ml_collections.ConfigDict
    plan: Plan
    data: Data
    checkpoint: Path | None
    base: Model | None
    single: Model | None

    @classmethod
    def load(cls, config: ml_collections.ConfigDict, plan: Plan) -> Members:
        """The checkpoint and the data of a study that trains its members, or a workdir's
        member 0 and the data it was trained on; a checkpoint's zero-shot classifier.

        Raises:
          DataError: data a zero-shot classifier cannot classify; a checkpoint that is no
            dual encoder where zero-shot asks for one.
        """
        if not plan.trains_members:
            single = from_pretrained(artefacts.hf_dir(plan.workdir.path, 0))
            return cls(config, plan, load_data(plan.members_config, single), None, None, single)
        path = checkpoint(config)
        base = None if path is None else from_pretrained(path)
        data = load_data(config, None if plan.zero_shot else base)
        single = None
        if plan.zero_shot:
            check_zero_shot(config, data)
            if base is not None:
                single = zero_shot_classifier(config, base, data, path)
        return cls(config, plan, data, path, base, single)

    @property
    def trains_here(self) -> bool:
        """Whether the study trains its member classifiers (not zero-shot, not a workdir's)."""
        return self.plan.trains_members and not self.plan.zero_shot

    def starting_point(self, seed: int) -> Model:
        """A member's starting point, initialised with `seed`: a fresh model of `config.model`
        (from scratch), or the checkpoint with its own classifier where it has one, else a new
        one sized from the data's classes."""
        if self.checkpoint is None:
            return Model.init(artefacts.scratch_config(self.config), jax.random.key(seed))
        if getattr(self.base.config, "num_labels", 0):  # 0: no classifier (or a SigLIP model)
            return self.base
        return with_classifier(self.base, self.data.num_classes, jax.random.key(seed))

    def calibration(self) -> Dataset:
        """The set head scores draw from: the training set, or for a zero-shot classifier the
        ID validation images where there are some."""
        if self.plan.zero_shot:
            validation = self.data.id_validation()
            return self.data.study.train if validation is None else validation
        return self.data.study.train

    def check(self, workdir: Workdir) -> None:
        """Everything the data and the starting model decide, before anything trains: the
        checkpoint's classes, the single-pass ensembles' settings, the analyses' settings on
        member 0 (or its starting point), the heads each Hydra member keeps, the calibration
        set's size."""
        config, plan = self.config, self.plan
        if self.base is not None and not plan.zero_shot:
            check_classes(self.base, config, self.data)
        if plan.efficient:  # the single-pass ensembles' settings on this architecture
            start = self.starting_point(0).config if self.checkpoint is not None else None
            check_single_pass(config, plan.efficient, start or artefacts.scratch_config(config))
        if (plan.analyses or plan.strategies) and not (plan.zero_shot and self.base is None):
            # Member 0, or (before it trains) its starting point, decides what the analyses see
            # and how many heads each Hydra member keeps.
            seed = members.training_seed(config, 0)
            first = self.starting_point(seed) if self.trains_here else self.single
            check_analyses_on(config, workdir, plan, first, self.data)
            if plan.strategies:
                ensembles.heads_per_member(first, config.num_members)
        check_calibration(config, plan, self.calibration())

    def member_zero(self, workdir: Workdir) -> tuple[Model, list[Model]]:
        """Member 0, once the workdir is claimed, and the member classifiers this run trained
        or restored: a zero-shot classifier (of a dual encoder trained here where there is no
        checkpoint, saved in our format), a workdir's member 0, or the members fine-tuned or
        trained here and published (`hf/member_M`)."""
        config, plan, single = self.config, self.plan, self.single
        if plan.zero_shot and self.base is None:  # no checkpoint: a dual encoder trained here
            data = self.data
            path = dual_encoder.train(config, workdir, data.study.train, data.classes.names)
            single = zero_shot_classifier(config, from_pretrained(path), data, path)
            check_analyses_on(config, workdir, plan, single, data)
        if plan.zero_shot:
            save_model(single, artefacts.zero_shot_dir(workdir.path))
        if not self.trains_here:
            return single, []
        trained = self.train_members(workdir)
        return trained[0], trained

    def train_members(self, workdir: Workdir) -> list[Model]:
        """Member m fine-tuned (or trained) with training seed m of the study and published
        (`hf/member_M`, with the checkpoint's preprocessing files)."""
        config, plan = self.config, self.plan
        count = config.ensemble_size if "deep_ensemble" in plan.methods else 1
        files_from = self.checkpoint
        return members.fit_classifiers(
            workdir,
            self.data.study.train,
            plan.member_settings,
            members.member_seeds(config, count),
            initial=self.starting_point,
            publish=functools.partial(
                artefacts.publish, files_from=files_from, our_pixels=files_from is None
            ),
        )


def zero_shot_classifier(
    config: ml_collections.ConfigDict, model: Model, data: Data, path: Path
) -> Model:
    """`model`, a dual encoder read from `path`, as a zero-shot classifier of the study's
    classes: class embeddings from `zero_shot.templates` filled with the class names, tokenised
    by the checkpoint's tokenizer and padded as its text tower was trained.

    Raises:
      DataError: not a dual encoder.
    """
    table = architecture(model.config)
    if table.vision_tower is None:
        raise DataError(
            f"zero_shot.enabled needs a dual encoder (CLIP, SigLIP, ViT-BERT); "
            f"{path} holds a {type(model.config).__name__}"
        )
    encoder = TextEncoder(path, config.data.max_tokens)
    fixed = table.prompt_length(model.config) if table.prompt_length else 0

    def tokenize(texts: list[str]) -> dict[str, Any]:  # else to the longest prompt
        return encoder.pad(texts, fixed, exact=True)

    return zero_shot(model, data.classes.names, tuple(config.zero_shot.templates), tokenize)
