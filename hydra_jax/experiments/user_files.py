"""A study's data from your files: `config.data.train` / `validation` / `test`, the named OOD
sets and the named shifted test sets, each a `KIND:LOCATION` spec (`hydra_jax.data.files`:
csv, tsv, jsonl, parquet, folder, npz, tfds, hf), read, checked and preprocessed with the
checkpoint's own files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_collections
import numpy as np

from hydra_jax.data import Dataset, TextEncoder, concat_all, files, image_index, pixel_cache
from hydra_jax.data.files import ClassNames, Columns, DataError
from hydra_jax.data.image_stream import ImageStream, Preprocessor
from hydra_jax.experiments import methods, study_data
from hydra_jax.experiments.workdir import split_names


def named_specs(value: str, key: str) -> dict[str, str]:
    """`NAME=SPEC,NAME=SPEC` as `{NAME: SPEC}` ("" is none)."""
    out = {}
    for item in split_names(str(value)):
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec or name in out:
            raise ValueError(
                f"{key}: {item!r} is not NAME=SPEC (names once each), e.g. "
                "news=jsonl:news.jsonl,photos=folder:photos/"
            )
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
    # With `data.skip_bad_images`: per source spec, the images left out (they do not decode).
    skipped_images: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def load(config: ml_collections.ConfigDict) -> UserData:
    """Reads every split named by `config.data`, checks it, then prepares it with the files of
    the checkpoint `config.model`: texts tokenised, images streamed (decoded and preprocessed
    batch by batch; with `data.cache`, once into the pixel cache). The limits cut fixed random
    subsets (seed 0). The validation sets are optional, unless a circuit strategy searches on
    them.

    Raises:
      DataError: a split that cannot be used, named with its file and problem.
    """
    d, checkpoint = config.data, Path(config.model)
    columns = Columns(d.text_column, d.pair_column, d.label_column)
    data_dir = study_data.data_dir(config)
    needs_validation = "circuit" in methods.strategies(config)
    if needs_validation and not (d.validation and d.ood_validation):
        raise ValueError(
            "the circuit strategy searches on validation data: set "
            "data.validation and data.ood_validation"
        )
    for key in ("train", "test"):
        if not d[key]:
            raise ValueError(f"data.{key} is not set: give a source such as csv:{key}.csv")
    labelled = {
        "train": d.train,
        "test": d.test,
        **({"validation": d.validation} if d.validation else {}),
    }
    raw = {key: files.read(spec, columns, data_dir) for key, spec in labelled.items()}
    ood_specs = named_specs(d.ood, "data.ood")
    ood_val_specs = named_specs(d.ood_validation, "data.ood_validation")
    shift_specs = named_specs(d.get("shift", ""), "data.shift")
    ood = {n: files.read(s, columns, data_dir, labelled=False) for n, s in ood_specs.items()}
    ood_val = [files.read(s, columns, data_dir, labelled=False) for s in ood_val_specs.values()]
    shifted = {n: files.read(s, columns, data_dir) for n, s in shift_specs.items()}
    every = [*raw.values(), *ood.values(), *ood_val, *shifted.values()]
    kinds = {split.origin: split.is_images for split in every}
    if len(set(kinds.values())) > 1:
        images = sorted(o for o, is_images in kinds.items() if is_images)
        raise DataError(f"text and images mixed in one study: images in {', '.join(images)}")
    classes = ClassNames.build(
        raw["train"].labels, files.checkpoint_id2label(checkpoint), raw["train"].origin
    )
    for split in [*raw.values(), *shifted.values()]:  # every label, before any preprocessing
        classes.encode(split.labels, split.origin)
    skipped: dict[str, list[str]] = {}
    if d.get("skip_bad_images", False):  # after the cheap checks: every image decoded once
        raw = {key: _decodable(split, labelled[key], skipped) for key, split in raw.items()}
        ood = {name: _decodable(split, ood_specs[name], skipped) for name, split in ood.items()}
        ood_val = [
            _decodable(split, spec, skipped)
            for split, spec in zip(ood_val, ood_val_specs.values(), strict=True)
        ]
        shifted = {n: _decodable(split, shift_specs[n], skipped) for n, split in shifted.items()}
    encoder = None if raw["train"].is_images else TextEncoder(checkpoint, d.max_tokens)
    preprocess = Preprocessor(checkpoint) if raw["train"].is_images else None
    cache = d.get("cache", "")

    def prepare(split: files.RawSplit, spec: str, limit: int, labels: bool = True) -> Dataset:
        if limit and limit < len(split):
            split = split.take(np.sort(np.random.default_rng(0).permutation(len(split))[:limit]))
        out = files.to_dataset(split, checkpoint, classes if labels else None, encoder, preprocess)
        if cache and isinstance(out, ImageStream):
            out = pixel_cache.cached(out, Path(cache), f"{spec} (limit {limit})")
        return out

    ood_limit = min((n for n in (d.eval_limit, d.ood_limit) if n), default=0)
    study = study_data.StudyData(
        train=prepare(raw["train"], d.train, d.train_limit),
        test=prepare(raw["test"], d.test, d.eval_limit),
        ood={
            name: prepare(split, ood_specs[name], ood_limit, labels=False)
            for name, split in ood.items()
        },
        shift={
            name: prepare(split, shift_specs[name], d.eval_limit) for name, split in shifted.items()
        },
    )
    validation = None
    if "validation" in raw:
        validation = prepare(raw["validation"], d.validation, d.eval_limit)
    pooled = None
    if ood_val:
        specs = list(ood_val_specs.values())
        pooled = concat_all(
            [prepare(s, spec, ood_limit, False) for s, spec in zip(ood_val, specs, strict=True)]
        )
    return UserData(study, classes, validation, pooled, encoder, skipped)


def _decodable(split: files.RawSplit, spec: str, skipped: dict[str, list[str]]) -> files.RawSplit:
    """`split` without its images that do not decode (a pass that decodes each image once),
    their names kept in `skipped[spec]`.

    Raises:
      DataError: not one image of the split decodes.
    """
    if split.images is None:
        return split
    good, bad = image_index.decodable(split.images, f"decode {spec}")
    if not bad:
        return split
    if len(good) == 0:
        raise DataError(f"{split.origin}: not one image decodes (e.g. {bad[0]})")
    skipped[spec] = bad
    return split.take(good)
