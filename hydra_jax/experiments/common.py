"""What the experiments share: a workdir owned by one config, text data, the baseline methods.

A workdir belongs to the config that first wrote `config.json` into it: a later `train.py` or
`evaluate.py` whose resolved config differs in anything that changes a result is refused, with
the differing keys named, and `config.json` is never rewritten.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from flax import traverse_util

from hydra_jax import data, metrics
from hydra_jax.convert import from_pretrained, minilm_l6_path
from hydra_jax.data import TextEncoder, TokenizedSet, random_tokens
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
from hydra_jax.models import Model

# Keys that change no result (only how a run is labelled).
COSMETIC_KEYS = frozenset({"title"})


class WorkdirError(ValueError):
    """A workdir that belongs to another config, or that a stage needs and lacks."""


def flat(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    """`{"a.b": value}` of a (nested) config, tuples as lists (as JSON writes them)."""
    tree = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    items = traverse_util.flatten_dict(tree, sep=".").items()
    return {k: json.loads(json.dumps(v)) for k, v in items}


def config_differences(config: ml_collections.ConfigDict, recorded: dict) -> list[str]:
    """Keys whose values differ between `config` and a recorded `config.json` (cosmetic ones
    excepted), each as `key: recorded -> now`."""
    now, before = flat(config), flat(recorded)
    keys = sorted((set(now) | set(before)) - COSMETIC_KEYS)
    missing = object()
    return [
        f"{k}: {before.get(k, missing)!r} -> {now.get(k, missing)!r}".replace(
            repr(missing), "(absent)"
        )
        for k in keys
        if now.get(k, missing) != before.get(k, missing)
    ]


def claim_workdir(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """Makes `workdir` this config's: writes `config.json` in a new one; in an existing one,
    refuses a config that differs in anything but cosmetic keys (and never rewrites it).

    Raises:
      WorkdirError: naming every differing key.
    """
    config_file = Path(workdir) / "config.json"
    if not config_file.is_file():
        Path(workdir).mkdir(parents=True, exist_ok=True)
        config_file.write_text(config.to_json_best_effort(indent=2, sort_keys=True))
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
        vocab, table = encoder.tokenizer.get_vocab_size(), model.config.vocab_size
        if vocab > table:
            raise ValueError(
                f"the tokenizer of {checkpoint_dir(config)} has {vocab} tokens but the model's "
                f"embedding table has {table} rows: ids >= {table} would be out of range"
            )
    return encoder


@dataclasses.dataclass(frozen=True)
class TextData:
    train: TokenizedSet
    test: TokenizedSet
    ood: dict[str, TokenizedSet]


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


def load_data(config: ml_collections.ConfigDict, model: Model | None = None) -> TextData:
    """Tokenised ID train/test and OOD test sets, cut to the config's limits (0 = all).

    `data.eval_limit` caps every test set; `data.ood_limit` (optional) caps the OOD test sets
    only; where both are set, the smaller applies. With `model`, its vocabulary is checked.
    """
    d, encoder = config.data, text_encoder(config, model)
    ood_limit = min((n for n in (d.eval_limit, d.get("ood_limit", 0)) if n), default=0)
    return TextData(
        train=tokenized_split(config, d.id_set, "train", d.train_limit, encoder),
        test=tokenized_split(config, d.id_set, "test", d.eval_limit, encoder),
        ood={name: tokenized_split(config, name, "test", ood_limit, encoder)
             for name in d.ood_sets},
    )  # fmt: skip


def base_model(config: ml_collections.ConfigDict) -> Model:
    return from_pretrained(checkpoint_dir(config))


def latency_batch(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    e = config.eval
    return random_tokens(np.random.default_rng(0), e.latency_batch, e.latency_tokens)


def read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


def evaluate_methods(
    config: ml_collections.ConfigDict,
    workdir: Path,
    to_evaluate: list[Method],
    text: TextData,
    stages: dict[str, float],
) -> dict[str, Any]:
    """Predictions, metrics, costs and plots of each method; writes every artefact.

    `results.json` records the config it was evaluated with (`config`).
    """
    results: dict[str, Any] = {"methods": {}}
    (workdir / "plots").mkdir(parents=True, exist_ok=True)
    for method in to_evaluate:
        start = time.perf_counter()
        logits = {"id": predict(method, text.test, config.eval.batch_size)}
        for name, ood_set in text.ood.items():
            logits[name] = predict(method, ood_set, config.eval.batch_size)
        predictions = {"labels": text.test.labels}
        for name, value in logits.items():
            prefix = "id" if name == "id" else f"ood_{name}"
            predictions[f"{prefix}_logits"] = value
            predictions[f"{prefix}_probs"] = softmax(value)
        stages[f"predict {method.name}"] = time.perf_counter() - start
        save_predictions(workdir / "predictions" / f"{method.name}.npz", predictions)
        result = method_metrics(predictions, list(text.ood), config.eval.num_bins)
        result["cost"] = cost(method, latency_batch(config), config.eval.latency_repeats)
        results["methods"][method.name] = result
        _plots(workdir / "plots", method.name, predictions, list(text.ood))
    results["stages"] = stages
    results["config"] = json.loads(config.to_json_best_effort())
    write_results(workdir, results)
    (workdir / "report.md").write_text(report.markdown(results, config.title))
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
    )
