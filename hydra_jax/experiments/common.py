"""What the experiments share: a workdir owned by one config, the study's data (text or images),
evaluation of a list of methods.

A workdir belongs to the config that first wrote `config.json` into it: a later `train.py` or
`evaluate.py` whose resolved config differs in anything that changes a result is refused, with
the differing keys named, and `config.json` is never rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from hydra_jax import checks, data, metrics
from hydra_jax.convert import from_pretrained, minilm_l6_path, save_pretrained
from hydra_jax.data import Dataset, TextEncoder, TokenizedSet, random_tokens
from hydra_jax.data.text import MIN_TOKENS
from hydra_jax.evaluation import (
    Method,
    cost,
    method_metrics,
    predict,
    report,
    save_predictions,
    softmax,
    write_results,
)
from hydra_jax.models import EncoderConfig, Model, ViTConfig
from hydra_jax.models.sharding import barrier, is_primary, to_host

# Keys that change no result: how a run is labelled, and the device mesh it is laid out on.
COSMETIC_KEYS = frozenset({"title", "mesh.data", "mesh.member", "mesh.heads"})
# Keys added after runs were recorded, with the value that reproduces those runs: a recorded
# config without one is read as having that value.
ADDED_KEYS = {"eval.dtype": "float32"}


class WorkdirError(ValueError):
    """A workdir that belongs to another config, that a stage needs and lacks, or that another
    run is using."""


LOCK_FILE = ".lock"


@contextlib.contextmanager
def hold_workdir(workdir: Path, create: bool = True) -> Iterator[None]:
    """Holds `workdir` exclusively while a stage runs: a second `train.py` or `evaluate.py` on it
    is refused, naming the process that holds it, and touches nothing of the first run.

    The lock is the operating system's (`flock` on `workdir/.lock`): it is released when the
    holder exits, killed or not, so a stale lock file never blocks a restart. Only process 0
    takes it (the processes of one run share the workdir). With `create=False`, a missing
    workdir is left missing (the stage reports it).
    """
    workdir = Path(workdir)
    if not is_primary() or not (create or workdir.is_dir()):
        yield
        return
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / LOCK_FILE).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise WorkdirError(
                f"{workdir} is in use by {holder}: wait for that run to end, or use another "
                "--workdir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()} on {socket.gethostname()} ({' '.join(sys.argv)})\n")
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def flat(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    """`{"a.b": value}` of a (nested) config, tuples as lists (as JSON writes them)."""
    tree = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    items = traverse_util.flatten_dict(tree, sep=".").items()
    return {k: json.loads(json.dumps(v)) for k, v in items}


def config_differences(config: ml_collections.ConfigDict, recorded: dict) -> list[str]:
    """Keys whose values differ between `config` and a recorded `config.json` (cosmetic ones
    excepted), each as `key: recorded -> now`."""
    now, before = flat(config), flat(recorded)
    before |= {k: v for k, v in ADDED_KEYS.items() if k in now and k not in before}
    keys = sorted((set(now) | set(before)) - COSMETIC_KEYS)
    missing = object()
    return [
        f"{k}: {before.get(k, missing)!r} -> {now.get(k, missing)!r}".replace(
            repr(missing), "(absent)"
        )
        for k in keys
        if now.get(k, missing) != before.get(k, missing)
    ]


# Config keys that are counts, with their least value (a study has the keys it uses). They are
# checked before a workdir is claimed: a bad value recorded there would make the corrected
# config conflict with the workdir.
COUNTS = {
    **dict.fromkeys(["eval.batch_size", "eval.num_bins", "eval.latency_batch",
                     "eval.latency_tokens", "eval.latency_repeats", "eval_batch_size",
                     "ensemble_size", "mc_dropout_samples", "num_members", "calibration_size"], 1),
    **dict.fromkeys(["data.train_limit", "data.eval_limit", "data.ood_limit", "data.shift_limit",
                     "train_limit", "eval_limit", "ood_limit"], 0),  # 0: the whole split
    "data.max_tokens": MIN_TOKENS,  # [CLS], a token, [SEP]
}  # fmt: skip


def check_counts(config: ml_collections.ConfigDict) -> None:
    """Refuses a count of `COUNTS` below its least value, or not an integer, by its key."""
    for key, value in flat(config).items():
        if key in COUNTS:
            checks.count(key, value, minimum=COUNTS[key])


def claim_workdir(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """Makes `workdir` this config's: writes `config.json` in a new one; in an existing one,
    refuses a config that differs in anything but cosmetic keys (and never rewrites it).

    Raises:
      ValueError: a count of `COUNTS` that is out of range (before anything is written).
      WorkdirError: naming every differing key.
    """
    check_counts(config)
    config_file = Path(workdir) / "config.json"
    new = not config_file.is_file()
    barrier("looked for config.json")  # several processes: all look before process 0 writes
    if new:
        if is_primary():
            Path(workdir).mkdir(parents=True, exist_ok=True)
            config_file.write_text(config.to_json_best_effort(indent=2, sort_keys=True))
        barrier("wrote config.json")
        return
    check_workdir(config, workdir)


def check_workdir(config: ml_collections.ConfigDict, workdir: Path) -> dict:
    """The recorded config of an existing run of `config` in `workdir`; creates nothing.

    Raises:
      WorkdirError: no run there, or one made with a config that differs (keys named).
    """
    config_file = Path(workdir) / "config.json"
    if not config_file.is_file():
        raise WorkdirError(
            f"{workdir} holds no run of this experiment (no config.json): run train.py with this "
            "--config and --workdir first"
        )
    recorded = json.loads(config_file.read_text())
    differences = config_differences(config, recorded)
    if differences:
        raise WorkdirError(
            f"{workdir} belongs to a run with another config; these keys differ (recorded -> "
            f"given): {'; '.join(differences)}. Use a new --workdir for a new configuration, or "
            "give the recorded values"
        )
    return recorded


def recorded_config(workdir: Path) -> ml_collections.ConfigDict:
    """The resolved config a `train.py` run wrote to its workdir (e.g. a base model's)."""
    config_file = Path(workdir) / "config.json"
    if not config_file.is_file():
        raise WorkdirError(f"{config_file} not found: train the base model in {workdir} first")
    return ml_collections.ConfigDict(json.loads(config_file.read_text()))


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
    """Refuses a tokenizer (of `checkpoint`) that can emit ids outside `model`'s vocabulary."""
    vocab, table = encoder.tokenizer.get_vocab_size(), model.config.vocab_size
    if vocab > table:
        raise ValueError(
            f"the tokenizer of {checkpoint} has {vocab} tokens but the model's "
            f"embedding table has {table} rows: ids >= {table} would be out of range"
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
        ood={name: tokenized_split(config, name, "test", ood_limit, encoder)
             for name in d.ood_sets},
    )  # fmt: skip


def base_model(config: ml_collections.ConfigDict) -> Model:
    return from_pretrained(checkpoint_dir(config))


def scratch_config(config: ml_collections.ConfigDict) -> ViTConfig:
    """The ViT of `config.model`, for grey images of the study's size and its classes."""
    m = config.model
    if m.width % m.heads:
        raise ValueError(f"model.width {m.width} is not a multiple of model.heads {m.heads}")
    encoder = EncoderConfig(
        num_heads=(m.heads,) * m.layers,
        width=m.width,
        head_dim=m.width // m.heads,
        mlp_dim=m.mlp_dim,
        activation="gelu",
        layer_norm_eps=1e-12,  # HF ViTConfig's default
        pre_norm=True,
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
    )
    return ViTConfig(
        encoder=encoder,
        image_size=data.IMAGE_SIZE,
        patch_size=m.patch_size,
        num_channels=1,
        pooler=False,  # ViTForImageClassification has none
        num_labels=num_classes(config),
    )


def publish(config: ml_collections.ConfigDict, model: Model, path: Path) -> None:
    """Writes `model` as an HF directory; for images with the `preprocessor_config.json` of
    `ViTImageProcessor` that reproduces our pixels (`data.to_pixels`). Every process takes part
    (the weights are gathered from all of them); process 0 writes."""
    model = Model(model.config, jax.tree.map(to_host, model.params))
    if is_primary():
        _write_hf(config, model, path)
    barrier(f"published {path}")


def _write_hf(config: ml_collections.ConfigDict, model: Model, path: Path) -> None:
    save_pretrained(model, path)
    if is_images(config):
        processor = {
            "image_processor_type": "ViTImageProcessor",
            "do_resize": True,
            "size": {"height": data.IMAGE_SIZE, "width": data.IMAGE_SIZE},
            "resample": 2,  # bilinear
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [data.images.PIXEL_MEAN],
            "image_std": [data.images.PIXEL_STD],
            "do_convert_rgb": False,
        }
        (Path(path) / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))


def latency_batch(config: ml_collections.ConfigDict, study: StudyData) -> dict[str, np.ndarray]:
    """A fixed batch for latency: the first test images, or random tokens of a fixed length."""
    e = config.eval
    if isinstance(study.test, data.ImageSet):
        batch = study.test.batch(np.arange(e.latency_batch) % len(study.test))
        return {"pixel_values": batch["pixel_values"]}
    return random_tokens(np.random.default_rng(0), e.latency_batch, e.latency_tokens)


def read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


def evaluate_methods(
    config: ml_collections.ConfigDict,
    workdir: Path,
    to_evaluate: list[Method],
    study: StudyData,
    stages: dict[str, float],
) -> dict[str, Any]:
    """Predictions, metrics, costs and plots of each method; writes every artefact.

    Per method: ID metrics, OOD metrics per set, and (images) ID metrics under each shift.
    `results.json` records the config it was evaluated with (`config`).
    """
    results: dict[str, Any] = {"methods": {}}
    (workdir / "plots").mkdir(parents=True, exist_ok=True)
    prefixed = {"id": study.test}
    prefixed |= {f"ood_{name}": s for name, s in study.ood.items()}
    prefixed |= {f"shift_{name}": s for name, s in study.shift.items()}
    for method in to_evaluate:
        start = time.perf_counter()
        predictions = {"labels": study.test.labels}
        for prefix, dataset in prefixed.items():
            logits = predict(method, dataset, config.eval.batch_size)
            predictions[f"{prefix}_logits"] = logits
            predictions[f"{prefix}_probs"] = softmax(logits)
        if study.shift:
            predictions["shift_labels"] = next(iter(study.shift.values())).labels
        stages[f"predict {method.name}"] = time.perf_counter() - start
        if is_primary():
            save_predictions(workdir / "predictions" / f"{method.name}.npz", predictions)
        result = method_metrics(predictions, list(study.ood), config.eval.num_bins)
        if study.shift:
            result["shift"] = {
                name: metrics.classification(
                    predictions[f"shift_{name}_probs"],
                    predictions["shift_labels"],
                    config.eval.num_bins,
                )
                for name in study.shift
            }
        result["cost"] = cost(method, latency_batch(config, study), config.eval.latency_repeats)
        results["methods"][method.name] = result
        if is_primary():
            _plots(workdir / "plots", method.name, predictions, list(study.ood))
    results["stages"] = stages
    results["config"] = json.loads(config.to_json_best_effort())
    if is_primary():
        write_results(workdir, results)
        text = report.markdown(results, config.title)
        logs = report.training_logs(workdir)
        if logs:  # the runs this workdir trained (a study on another's models has none)
            report.loss_curves(workdir / "plots" / "training_loss.png", logs, config.title)
            text += report.training_section(logs, "plots/training_loss.png")
        (workdir / "report.md").write_text(text)
    barrier("wrote the results")
    return results


def _plots(directory: Path, name: str, predictions: dict, ood_sets: list[str]) -> None:
    report.reliability_plot(
        directory / f"reliability_{name}.png",
        predictions["id_probs"],
        predictions["labels"],
        f"{name}: reliability (ID test)",
    )
    report.ood_histogram(
        directory / f"ood_scores_{name}.png",
        metrics.ood_score(predictions["id_probs"], "msp"),
        {s: metrics.ood_score(predictions[f"ood_{s}_probs"], "msp") for s in ood_sets},
        f"{name}: MSP scores",
        num_classes=predictions["id_probs"].shape[-1],
    )
