"""A study's data: the embedded text and image sets of the paper studies, split, cut to the
config's limits and preprocessed, as `StudyData` (ID train/test, OOD test sets, shifted test
sets), and the validation sets of circuit search.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import ml_collections
import numpy as np

from hydra_jax import data
from hydra_jax.convert import minilm_l6_path
from hydra_jax.data import Dataset, TextEncoder, TokenizedSet, concat_all, random_tokens
from hydra_jax.models import BertConfig, Model
from hydra_jax.models.sharding import barrier, is_primary

# The class names of the embedded sets that have them (label order), for zero-shot prompts.
CLASS_NAMES = {
    "fashion_mnist": (
        "t-shirt",
        "trouser",
        "pullover",
        "dress",
        "coat",
        "sandal",
        "shirt",
        "sneaker",
        "bag",
        "ankle boot",
    ),
}

# The embedded OOD sets by how far they lie from their ID set (docs/data.md): near-OOD shares
# the ID set's format and domain (the text studies' movie reviews: other reviews and opinions;
# Fashion-MNIST: other centred grey 28 x 28 shapes), far-OOD does not.
OOD_GROUPS = {
    "tweets": "near",
    "amazon_reviews": "near",
    "nyt_editorials": "far",
    "mnist": "near",
    "digits": "near",
    "photos": "far",
}


def checkpoint_dir(config: ml_collections.ConfigDict) -> Path:
    return Path(config.checkpoint) if config.checkpoint else minilm_l6_path()


def data_dir(config: ml_collections.ConfigDict) -> Path:
    return Path(config.data_dir) if config.data_dir else data.default_data_dir()


def text_encoder(config: ml_collections.ConfigDict, model: Model | None = None) -> TextEncoder:
    """The checkpoint's tokenizer; refused if it can emit ids outside `model`'s vocabulary."""
    encoder = TextEncoder(checkpoint_dir(config), config.data.max_tokens)
    if model is not None:
        check_vocabulary(encoder, model, checkpoint_dir(config))
    return encoder


def check_vocabulary(encoder: TextEncoder, model: Model, checkpoint: Path) -> None:
    """Refuses a tokenizer (of `checkpoint`) that can emit ids outside `model`'s vocabulary, or
    that pads with another id than the one a RoBERTa-family model counts positions from."""
    vocab, table = encoder.tokenizer.get_vocab_size(), model.config.vocab_size
    if vocab > table:
        raise ValueError(
            f"the tokenizer of {checkpoint} has {vocab} tokens but the model's "
            f"embedding table has {table} rows: ids >= {table} would be out of range"
        )
    config = model.config
    roberta = isinstance(config, BertConfig) and config.variant.positions_after_padding
    if roberta and encoder.pad_id != config.pad_token_id:
        raise ValueError(
            f"the tokenizer of {checkpoint} pads with id {encoder.pad_id} but the model's "
            f"pad_token_id is {config.pad_token_id}: its positions would be wrong"
        )


def is_images(config: ml_collections.ConfigDict) -> bool:
    """Whether the study's in-distribution set is an image set (else a sentence set)."""
    return config.data.id_set in data.IMAGE_SETS


def num_classes(config: ml_collections.ConfigDict) -> int:
    return data.NUM_CLASSES[config.data.id_set]


@dataclasses.dataclass(frozen=True)
class StudyData:
    """The ID train and test sets, the OOD test sets, and shifted copies of the ID test set
    (`shift`, named `CORRUPTION_SEVERITY`; images only)."""

    train: Dataset
    test: Dataset
    ood: dict[str, Dataset]
    shift: dict[str, Dataset] = dataclasses.field(default_factory=dict)


def tokenized_split(
    config: ml_collections.ConfigDict,
    name: str,
    split: str,
    limit: int = 0,
    encoder: TextEncoder | None = None,
) -> TokenizedSet:
    """One split of a sentence set, tokenised with the checkpoint's tokenizer.

    With `limit`, a fixed random subset (seed 0) of that many sentences.
    """
    encoder = encoder or text_encoder(config)
    sentences = data.load(name, split, data_dir(config))
    if limit and limit < len(sentences):
        sentences = sentences.take(np.random.default_rng(0).permutation(len(sentences))[:limit])
    return TokenizedSet(encoder(sentences.texts), sentences.labels, encoder.pad_id)


def image_arrays(
    config: ml_collections.ConfigDict, name: str, split: str, limit: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """One split of an image set as `uint8` images and labels; with `limit`, a fixed random
    subset (seed 0), as for sentences."""
    images, labels = data.load_images(name, split, data_dir(config))
    if limit and limit < len(labels):
        index = np.random.default_rng(0).permutation(len(labels))[:limit]
        images, labels = images[index], labels[index]
    return images, labels


def load_split(
    config: ml_collections.ConfigDict,
    name: str,
    split: str,
    limit: int = 0,
    encoder: TextEncoder | None = None,
) -> Dataset:
    """One split of the study's modality (`encoder`: text only, to tokenise once)."""
    if is_images(config):
        return data.image_set(*image_arrays(config, name, split, limit))
    return tokenized_split(config, name, split, limit, encoder)


def load_data(config: ml_collections.ConfigDict, model: Model | None = None) -> StudyData:
    """ID train/test and OOD test sets, cut to the config's limits (0 = all); for images, the
    ID test set under every corruption of `data.corruptions` at every severity.

    `data.eval_limit` caps every test set; `data.ood_limit` (optional) caps the OOD test sets
    only; where both are set, the smaller applies; `data.shift_limit` (images) caps the shifted
    sets (the first that many of the ID test images). With a text `model`, its vocabulary is
    checked against the tokenizer.
    """
    d = config.data
    if jax.process_count() > 1:  # process 0 prepares the TFDS sources, then all read them
        if is_primary():
            (data.prepare_images if is_images(config) else data.prepare)(data_dir(config))
        barrier("prepared the data")
    ood_limit = min((n for n in (d.eval_limit, d.get("ood_limit", 0)) if n), default=0)
    if is_images(config):
        images, labels = image_arrays(config, d.id_set, "test", d.eval_limit)
        # The shifted sets: the first `shift_limit` of those test images (0 = all), corrupted.
        shifted = slice(d.get("shift_limit", 0) or None)
        shift = {
            f"{corruption}_{severity}": data.image_set(
                data.corrupt(images[shifted], corruption, severity), labels[shifted]
            )
            for corruption in d.corruptions
            for severity in data.SEVERITIES
        }
        return StudyData(
            train=load_split(config, d.id_set, "train", d.train_limit),
            test=data.image_set(images, labels),
            ood={name: load_split(config, name, "test", ood_limit) for name in d.ood_sets},
            shift=shift,
        )
    encoder = text_encoder(config, model)
    return StudyData(
        train=tokenized_split(config, d.id_set, "train", d.train_limit, encoder),
        test=tokenized_split(config, d.id_set, "test", d.eval_limit, encoder),
        ood={
            name: tokenized_split(config, name, "test", ood_limit, encoder) for name in d.ood_sets
        },
    )


def id_validation(config: ml_collections.ConfigDict) -> Dataset:
    """The study's ID validation split."""
    return load_split(config, config.data.id_set, "validation")


def ood_validation(config: ml_collections.ConfigDict) -> Dataset:
    """The study's OOD validation splits, pooled."""
    encoder = None if is_images(config) else text_encoder(config)
    return concat_all(
        [load_split(config, n, "validation", encoder=encoder) for n in config.data.ood_sets]
    )


def validation_sets(config: ml_collections.ConfigDict) -> tuple[Dataset, Dataset]:
    """The study's ID validation split and its OOD validation splits pooled."""
    return id_validation(config), ood_validation(config)


def latency_batch(config: ml_collections.ConfigDict, test: Dataset) -> dict[str, np.ndarray]:
    """A fixed batch for latency: the first `test` images, or random tokens of a fixed length."""
    e = config.eval
    if isinstance(test, TokenizedSet):
        return random_tokens(np.random.default_rng(0), e.latency_batch, e.latency_tokens)
    batch = test.batch(np.arange(e.latency_batch) % len(test))
    return {"pixel_values": batch["pixel_values"]}
