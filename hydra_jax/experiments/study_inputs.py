"""A study's inputs: its data (the embedded sets of the paper studies, or your files), the
checkpoint its members start from, and the classes zero-shot holds out."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import ml_collections
import numpy as np

from hydra_jax.data import Dataset, TextEncoder
from hydra_jax.data.files import ClassNames, DataError
from hydra_jax.experiments import study_data, user_files
from hydra_jax.models import Model


@dataclasses.dataclass(frozen=True)
class Data:
    """A study's sets, and what its data decide besides: the number of classes, their names
    (labelled files), the tokenizer (text) and the ID and pooled OOD validation sets (read when
    first asked for, once; None where the study has none)."""

    study: study_data.StudyData
    num_classes: int
    id_validation: Callable[[], Dataset | None]
    ood_validation: Callable[[], Dataset | None]
    classes: ClassNames | None = None
    encoder: TextEncoder | None = None
    # Images left out because they do not decode (`data.skip_bad_images`), per source spec.
    skipped_images: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def validation(self) -> tuple[Dataset | None, Dataset | None]:
        """Circuit search's ID and pooled OOD validation sets."""
        return self.id_validation(), self.ood_validation()


# Where a study's members come from (`members_from`), and its data (`data.source`).
MEMBER_SOURCES = ("checkpoint", "scratch", "workdir")
DATA_SOURCES = ("embedded", "files")


def from_files(config: ml_collections.ConfigDict) -> bool:
    """Whether the study reads your files (`data.source` "files": `data.train`, ...) rather
    than its embedded sets ("embedded": `data.id_set`, `data.ood_sets`)."""
    return config.data.source == "files"


def check_sources(config: ml_collections.ConfigDict) -> None:
    """Refuses a `members_from` or `data.source` that is unknown or that the config's other
    fields contradict.

    Raises:
      ValueError: naming the field, its value and what it needs.
    """
    source = config.get("members_from")
    if source not in MEMBER_SOURCES:
        raise ValueError(f"members_from is {source!r}; choose one of {MEMBER_SOURCES}")
    if (source == "workdir") != bool(config.get("base_workdir")):
        raise ValueError(
            f"members_from is {source!r} and base_workdir is {config.get('base_workdir')!r}: "
            "members read from a workdir need base_workdir, and only they"
        )
    scratch = isinstance(config.get("model"), ml_collections.ConfigDict)
    if source != "workdir" and scratch != (source == "scratch"):
        raise ValueError(
            f"members_from is {source!r}, but config.model is "
            + ("an architecture (`scratch` trains it)" if scratch else "a checkpoint path")
        )
    data = config.get("data")
    if source != "workdir" and (data is None or data.get("source") not in DATA_SOURCES):
        got = None if data is None else data.get("source")
        raise ValueError(f"data.source is {got!r}; choose one of {DATA_SOURCES}")


def load_data(config: ml_collections.ConfigDict, model: Model | None = None) -> Data:
    """The data of `config`, the config the members are trained under; with a text `model`,
    its vocabulary is checked against the tokenizer. The classes `zero_shot.held_out` names are
    taken out of the training and ID validation sets (`seen_only`).

    Raises:
      DataError: a file split that cannot be used, named with its file and problem; a held-out
        class the data do not have.
    """
    if from_files(config):
        user = user_files.load(config)
        if model is not None and user.encoder is not None:
            study_data.check_vocabulary(user.encoder, model, Path(config.model))
        data = Data(
            user.study,
            len(user.classes.names),
            lambda: user.validation,
            lambda: user.ood_validation,
            user.classes,
            user.encoder,
            user.skipped_images,
        )
    else:
        names = study_data.CLASS_NAMES.get(config.data.id_set)
        data = Data(
            study_data.load_data(config, model),
            study_data.num_classes(config),
            functools.cache(functools.partial(study_data.id_validation, config)),
            functools.cache(functools.partial(study_data.ood_validation, config)),
            ClassNames(names) if names else None,
        )
    held = held_out(config, data)
    return seen_only(data, np.array(list(held.values()), int)) if held else data


def held_out(config: ml_collections.ConfigDict, data: Data) -> dict[str, int]:
    """The classes `zero_shot.held_out` names, each with its index (none where it names none).

    Raises:
      DataError: a name that is not one of the data's classes.
    """
    names = config.zero_shot.get("held_out", ()) if config.get("zero_shot") else ()
    known = data.classes.names if data.classes else ()
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise DataError(
            f"zero_shot.held_out names unknown classes {unknown}; classes: {list(known)}"
        )
    return {name: known.index(name) for name in names}


def seen_only(data: Data, held: np.ndarray) -> Data:
    """`data` whose training and ID validation sets hold none of the classes `held`: nothing of
    a held-out class reaches a model, not even through head selection."""

    def seen(dataset: Dataset | None) -> Dataset | None:
        if dataset is None:
            return None
        return dataset.take(np.nonzero(~np.isin(dataset.labels, held))[0])

    study = dataclasses.replace(data.study, train=seen(data.study.train))
    validation = data.id_validation
    seen_validation = functools.cache(lambda: seen(validation()))
    return dataclasses.replace(data, study=study, id_validation=seen_validation)


def checkpoint(config: ml_collections.ConfigDict) -> Path | None:
    """The checkpoint the members start from: `model` (a local HF directory) or `checkpoint`
    ("": the embedded MiniLM); None when they train from scratch (`members_from`)."""
    if config.members_from == "scratch":
        return None
    model = config.get("model", "")
    if from_files(config):
        if not model:
            raise ValueError(
                "config.model is not set: give a local HF directory, --config.model=DIR"
            )
        return Path(model)
    return study_data.checkpoint_dir(config)


def zero_shot_enabled(config: ml_collections.ConfigDict) -> bool:
    return bool(config.get("zero_shot") and config.zero_shot.enabled)
