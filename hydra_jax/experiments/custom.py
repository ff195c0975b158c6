"""Your model, your data: the whole comparison on a local checkpoint and your data files.

`train(config, workdir)`: `ensemble_size` classifiers fine-tuned from `config.model` on
`data.train` (member m with training seed `1000 * seed + m`; member 0 is `single`), each
published as an HF directory `hf/member_M` with the checkpoint's tokenizer or image-processor
files; then, for every strategy a `hydra_*` or `pruned_*` method names, member head sets from
member 0, the members compacted, fine-tuned and fused (`fused/STRATEGY`; member 0 alone in
`pruned/STRATEGY`); for `batch_ensemble` / `lora_ensemble`, that ensemble of `ensemble_size`
members built from `config.model` (with member 0's initial classifier) and fine-tuned, and for
`packed_ensemble` a Packed-Ensemble of `config.model`'s architecture trained from scratch
(`efficient/KIND`). `evaluate(config, workdir)` loads those and evaluates `config.methods` on
`data.test` and every OOD set. A checkpoint without a classifier gets one sized from the labels;
one with a classifier keeps it, and the labels must fit it.

With `zero_shot.enabled`, `config.model` is a dual encoder (CLIP, SigLIP, ViT-BERT) and nothing
trains: `single` is its vision tower classifying by prompt-ensemble class embeddings (the
`zero_shot.templates` filled with the class names; `zero_shot/`), and each Hydra's members are
that classifier pruned to their head sets, fused as they are.

Data sources are `KIND:LOCATION` specs (`hydra_jax.data.files`); `data.ood` and
`data.ood_validation` are `NAME=SPEC` lists, comma-separated. Every split is read and checked
before anything trains.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from hydra_jax import ensembles
from hydra_jax.convert import from_pretrained
from hydra_jax.convert.native import save_model
from hydra_jax.data import Dataset, TextEncoder, concat_all, files
from hydra_jax.data.files import ClassNames, Columns, DataError
from hydra_jax.ensembles import STRATEGIES
from hydra_jax.experiments import artefacts, members, methods, study_data
from hydra_jax.experiments.evaluators import evaluate_methods
from hydra_jax.experiments.workdir import Workdir
from hydra_jax.models import Model, with_classifier, zero_shot
from hydra_jax.models.architectures import architecture
from hydra_jax.models.sharding import barrier
from hydra_jax.training import TrainSettings


def method_names(config: ml_collections.ConfigDict) -> list[str]:
    """`config.methods`, comma-separated (`single,deep_ensemble,hydra_taylor`)."""
    try:
        return methods.check_names([n.strip() for n in str(config.methods).split(",") if n.strip()])
    except ValueError as error:
        raise ValueError(f"config.{error}") from None


# What a zero-shot study can run: it trains nothing.
ZERO_SHOT_METHODS = ("single", *(f"{kind}_{s}" for kind in ("pruned", "hydra") for s in STRATEGIES))


def check_zero_shot(config: ml_collections.ConfigDict) -> None:
    """Refuses methods that need training in a zero-shot study."""
    needs_training = [n for n in method_names(config) if n not in ZERO_SHOT_METHODS]
    if config.zero_shot.enabled and needs_training:
        raise ValueError(f"zero_shot.enabled trains nothing, so {needs_training} cannot run; "
                         "zero-shot methods: single, pruned_S, hydra_S")  # fmt: skip


def strategies(config: ml_collections.ConfigDict) -> list[str]:
    """The member strategies that the methods need, in the order they are named."""
    out = []
    for name in method_names(config):
        prefix, _, strategy = name.partition("_")
        if prefix in ("hydra", "pruned") and strategy not in out:
            out.append(strategy)
    return out


def named_specs(value: str, key: str) -> dict[str, str]:
    """`NAME=SPEC,NAME=SPEC` as `{NAME: SPEC}` ("" is none)."""
    out = {}
    for item in filter(None, (s.strip() for s in str(value).split(","))):
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec or name in out:
            raise ValueError(f"{key}: {item!r} is not NAME=SPEC (names once each), e.g. "
                             "news=jsonl:news.jsonl,photos=folder:photos/")  # fmt: skip
        out[name] = spec
    return out


@dataclasses.dataclass(frozen=True)
class UserData:
    """The study's sets, preprocessed, and the class names every split was labelled with."""

    study: study_data.StudyData
    classes: ClassNames
    validation: Dataset | None  # ID validation (circuit search)
    ood_validation: Dataset | None  # OOD validation, pooled (circuit search)
    encoder: TextEncoder | None  # the checkpoint's tokenizer (None for images)


def load(config: ml_collections.ConfigDict) -> UserData:
    """Reads every split named by `config.data`, checks it, then preprocesses it with the
    checkpoint's files; the limits cut fixed random subsets (seed 0).

    Raises:
      DataError: a split that cannot be used, named with its file and problem.
    """
    d, checkpoint = config.data, Path(config.model)
    columns = Columns(d.text_column, d.pair_column, d.label_column)
    data_dir = study_data.data_dir(config)
    needs_validation = "circuit" in strategies(config)
    if needs_validation and not (d.validation and d.ood_validation):
        raise ValueError("the circuit strategy searches on validation data: set "
                         "data.validation and data.ood_validation")  # fmt: skip
    labelled = {"train": d.train, "test": d.test}
    if needs_validation:
        labelled["validation"] = d.validation
    for key, spec in labelled.items():
        if not spec:
            raise ValueError(f"data.{key} is not set: give a source such as csv:{key}.csv")
    raw = {key: files.read(spec, columns, data_dir) for key, spec in labelled.items()}
    ood_specs = named_specs(d.ood, "data.ood")
    ood_val_specs = named_specs(d.ood_validation, "data.ood_validation") if needs_validation else {}
    ood = {n: files.read(s, columns, data_dir, labelled=False) for n, s in ood_specs.items()}
    ood_val = [files.read(s, columns, data_dir, labelled=False) for s in ood_val_specs.values()]
    kinds = {split.origin: split.is_images for split in [*raw.values(), *ood.values(), *ood_val]}
    if len(set(kinds.values())) > 1:
        images = sorted(o for o, is_images in kinds.items() if is_images)
        raise DataError(f"text and images mixed in one study: images in {', '.join(images)}")
    classes = ClassNames.build(raw["train"].labels, files.checkpoint_id2label(checkpoint),
                               raw["train"].origin)  # fmt: skip
    for split in raw.values():  # every label checked before anything is preprocessed
        classes.encode(split.labels, split.origin)
    encoder = None if raw["train"].is_images else TextEncoder(checkpoint, d.max_tokens)

    def prepare(split: files.RawSplit, limit: int, labels: bool = True) -> Dataset:
        if limit and limit < len(split):
            index = np.sort(np.random.default_rng(0).permutation(len(split))[:limit])
            split = dataclasses.replace(split, **{
                f.name: [getattr(split, f.name)[i] for i in index]
                for f in dataclasses.fields(split)
                if f.name != "origin" and getattr(split, f.name) is not None
            })  # fmt: skip
        return files.to_dataset(split, checkpoint, classes if labels else None, encoder)

    ood_limit = min((n for n in (d.eval_limit, d.ood_limit) if n), default=0)
    study = study_data.StudyData(
        train=prepare(raw["train"], d.train_limit),
        test=prepare(raw["test"], d.eval_limit),
        ood={name: prepare(split, ood_limit, labels=False) for name, split in ood.items()},
    )
    validation = prepare(raw["validation"], d.eval_limit) if needs_validation else None
    pooled = concat_all([prepare(s, ood_limit, False) for s in ood_val]) if ood_val else None
    return UserData(study, classes, validation, pooled, encoder)


def initial_model(config: ml_collections.ConfigDict, classes: ClassNames, seed: int) -> Model:
    """`config.model` as a classifier of `classes`: its own classifier where it has one (which
    must have as many classes), else a new one initialised with `seed`."""
    model = from_pretrained(Path(config.model))
    C, own = len(classes.names), getattr(model.config, "num_labels", 0)  # 0: a SigLIP model
    if own and own != C:
        raise DataError(f"the classifier of {config.model} has {own} classes but "
                        f"{config.data.train} has {C}: {list(classes.names)}")  # fmt: skip
    return model if own else with_classifier(model, C, jax.random.key(seed))


def zero_shot_classifier(config: ml_collections.ConfigDict, user: UserData) -> Model:
    """`config.model`, a dual encoder, as a zero-shot classifier of the study's classes: class
    embeddings from `zero_shot.templates` filled with the class names, tokenised by the
    checkpoint's tokenizer and padded as its text tower was trained.

    Raises:
      DataError: not a dual encoder, text data, or classes without names (integer labels).
    """
    model = from_pretrained(Path(config.model))
    table = architecture(model.config)
    if table.vision_tower is None:
        raise DataError(f"zero_shot.enabled needs a dual encoder (CLIP, SigLIP, ViT-BERT); "
                        f"{config.model} holds a {type(model.config).__name__}")  # fmt: skip
    if user.encoder is not None:
        raise DataError(f"zero-shot classifies images; {config.data.train} holds text")
    names = user.classes.names
    if all(name.isdigit() for name in names):
        raise DataError(f"zero-shot prompts need class names, but {config.data.train} "
                        f"labels its classes {list(names)}: use string labels or class "
                        "folders")  # fmt: skip
    encoder = TextEncoder(Path(config.model), config.data.max_tokens)
    fixed = table.prompt_length(model.config) if table.prompt_length else 0

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:  # else to the longest prompt
        return encoder.pad(texts, fixed or max(t.size for t in encoder(texts)))

    return zero_shot(model, names, tuple(config.zero_shot.templates), tokenize)


def saved_path(workdir: Path, method: str) -> Path:
    """Where `train` saves method `hydra_S` (the fused network) or `pruned_S` (member 0)."""
    kind, strategy = method.split("_", 1)
    return Path(workdir) / ("fused" if kind == "hydra" else "pruned") / strategy


def train(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, Any]:
    """Fine-tunes the members, builds every Hydra the methods need (resuming where it stopped)."""
    workdir = Workdir.of(workdir)
    settings = TrainSettings(**config.train.to_dict())  # refused before the workdir is touched
    member_settings = TrainSettings(**{**config.train.to_dict(), **config.member_train.to_dict()})
    names = method_names(config)
    check_zero_shot(config)
    with workdir.stage("load data"):
        user = load(config)
    single = zero_shot_classifier(config, user) if config.zero_shot.enabled else None
    workdir.claim(config)
    train_set = user.study.train

    def initial(seed: int) -> Model:
        model = initial_model(config, user.classes, seed)
        if user.encoder is not None:
            study_data.check_vocabulary(user.encoder, model, Path(config.model))
        return model

    for kind in (n for n in names if n in members.EFFICIENT):  # settings refused before training
        members.efficient_settings(config, kind)
    count = config.ensemble_size if "deep_ensemble" in names else 1
    if single is not None:  # zero-shot: nothing to train
        save_model(single, artefacts.zero_shot_dir(workdir.path))
    else:
        single = members.fit_classifiers(
            workdir, train_set, settings, members.member_seeds(config, count), initial,
            lambda model, path: artefacts.publish(model, path, files_from=Path(config.model)),
        )[0]  # fmt: skip
    record: dict[str, Any] = {}
    steps: dict[Any, Any] = {}
    seeds = members.member_seeds(config, config.num_members)
    validation = lambda: (user.validation, user.ood_validation)  # noqa: E731
    for strategy in strategies(config):
        with workdir.stage(f"{strategy}: head sets"):
            sets = members.head_sets(config, strategy, single, train_set, seeds, validation)
        record[strategy] = sets.astype(int).tolist()
        zero = config.zero_shot.enabled  # its members are pruned as they are: nothing trains
        with workdir.stage(f"{strategy}: {'prune' if zero else 'fine-tune'} members"):
            directory = workdir / "hydra_members" / strategy
            hydra_members = ensembles.members_from(single, sets) if zero else (
                members.fine_tuned_members(single, sets, train_set, member_settings, seeds,
                                           directory, steps))  # fmt: skip
            save_model(ensembles.fuse(hydra_members), saved_path(workdir.path, f"hydra_{strategy}"))
            save_model(hydra_members[0], saved_path(workdir.path, f"pruned_{strategy}"))
    own_head = getattr(from_pretrained(Path(config.model)).config, "num_labels", 0) > 0
    for kind in (n for n in names if n in members.EFFICIENT):  # none in a zero-shot study
        seed = members.training_seed(config, 0)
        fresh = 0 if own_head else len(user.classes.names)  # LoRA: a new head per member
        ensemble = members.efficient_ensemble(config, kind, initial(seed), seed, fresh)
        settings = dataclasses.replace(members.efficient_settings(config, kind), seed=seed)
        members.fit_efficient(workdir, kind, ensemble, train_set, settings)
    workdir.write_json("classes.json", list(user.classes.names))
    workdir.write_json("head_sets.json", record)
    workdir.save_stages()  # a member an earlier run trained keeps that run's time
    barrier("wrote the training record")
    return record


def evaluate(config: ml_collections.ConfigDict, workdir: Workdir | Path) -> dict[str, Any]:
    """Evaluates `config.methods` from the artefacts `train` wrote; trains nothing."""
    workdir = Workdir.of(workdir)
    workdir.check(config)
    trained = methods.Trained(workdir, config, workdir, config.eval.dtype)
    to_evaluate = methods.build(method_names(config), trained)
    with workdir.stage("load data"):
        user = load(config)
    return evaluate_methods(config, workdir, to_evaluate, user.study)
