"""The uncertainty experiment behind `train.py` and `evaluate.py`, importable for tests/notebooks.

`train(config, workdir)` fine-tunes one classifier per seed (seed 0 is `single`; seeds 0..M-1 are
the deep ensemble); `evaluate(config, workdir)` runs every method of `config.methods` on the ID
test set and each OOD test set and writes the artefacts of `hydra_jax.evaluation`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from hydra_jax import baselines, data, metrics, report
from hydra_jax.convert import from_pretrained, minilm_l6_path
from hydra_jax.data.text import TextEncoder
from hydra_jax.evaluation import (
    Method,
    cost,
    method_metrics,
    predict,
    random_tokens,
    save_predictions,
    softmax,
    write_results,
)
from hydra_jax.models import Model
from hydra_jax.models.model import with_classifier
from hydra_jax.training import (
    TokenizedSet,
    TrainSettings,
    fit,
    make_optimizer,
    make_train_step,
    schedule_length,
)

NUM_CLASSES = 2


def checkpoint_dir(config: ml_collections.ConfigDict) -> Path:
    return Path(config.checkpoint) if config.checkpoint else minilm_l6_path()


def data_dir(config: ml_collections.ConfigDict) -> Path:
    return Path(config.data_dir) if config.data_dir else data.default_data_dir()


@dataclasses.dataclass(frozen=True)
class TextData:
    train: TokenizedSet
    test: TokenizedSet
    ood: dict[str, TokenizedSet]


def tokenized_split(
    config: ml_collections.ConfigDict, name: str, split: str, limit: int = 0
) -> TokenizedSet:
    """One split of a sentence set, tokenised with the checkpoint's tokenizer.

    With `limit`, a fixed random subset (seed 0) of that many sentences.
    """
    encoder = TextEncoder(checkpoint_dir(config), config.data.max_tokens)
    sentences = data.load(name, split, data_dir(config))
    if limit and limit < len(sentences):
        sentences = sentences.take(np.random.default_rng(0).permutation(len(sentences))[:limit])
    return TokenizedSet(encoder(sentences.texts), sentences.labels, encoder.pad_id)


def load_data(config: ml_collections.ConfigDict) -> TextData:
    """Tokenised ID train/test and OOD test sets, cut to the config's limits (0 = all).

    `data.eval_limit` caps every test set; `data.ood_limit` (optional) caps the OOD test sets
    only; where both are set, the smaller applies.
    """
    d = config.data
    ood_limit = min((n for n in (d.eval_limit, d.get("ood_limit", 0)) if n), default=0)
    return TextData(
        train=tokenized_split(config, d.id_set, "train", d.train_limit),
        test=tokenized_split(config, d.id_set, "test", d.eval_limit),
        ood={name: tokenized_split(config, name, "test", ood_limit) for name in d.ood_sets},
    )


def member_seeds(config: ml_collections.ConfigDict) -> list[int]:
    return list(range(config.ensemble_size)) if "deep_ensemble" in config.methods else [0]


def write_config(config: ml_collections.ConfigDict, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True))


def train(
    config: ml_collections.ConfigDict,
    workdir: Path,
    text: TextData | None = None,
    resume_only: bool = False,
    seeds: list[int] | None = None,
) -> list[Model]:
    """Fine-tunes (or, finished, restores) one classifier per member seed."""
    workdir = Path(workdir)
    if not resume_only:
        write_config(config, workdir)
    text = text or load_data(config)
    base = from_pretrained(checkpoint_dir(config))
    models, step_fn, timings = [], None, {}
    for seed in member_seeds(config) if seeds is None else seeds:
        settings = TrainSettings(**config.train.to_dict(), seed=seed)
        model = with_classifier(base, NUM_CLASSES, jax.random.key(seed))
        if step_fn is None:
            total = schedule_length(len(text.train.tokens), settings)[1]
            step_fn = make_train_step(model, make_optimizer(settings, total))
        start = time.perf_counter()
        directory = workdir / "members" / f"seed_{seed}"
        models.append(fit(model, text.train, settings, directory, step_fn=step_fn,
                          resume_only=resume_only))  # fmt: skip
        timings[f"train seed {seed}"] = time.perf_counter() - start
    if not resume_only:
        (workdir / "train_timings.json").write_text(json.dumps(timings, indent=2))
    return models


def base_config(workdir: Path) -> ml_collections.ConfigDict:
    """The resolved config a `train.py` run wrote to its workdir."""
    config_file = Path(workdir) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found: train the base model first")
    return ml_collections.ConfigDict(json.loads(config_file.read_text()))


def trained(
    workdir: Path, config: ml_collections.ConfigDict, seeds: list[int] | None = None
) -> tuple[list[Model], TextData]:
    """The finished members of a `train.py` workdir trained with `config` (`base_config`)."""
    text = load_data(config)
    return train(config, workdir, text, resume_only=True, seeds=seeds), text


def methods(config: ml_collections.ConfigDict, models: list[Model]) -> list[Method]:
    single = models[0]
    available = {
        "single": lambda: Method("single", baselines.single(single), single.params),
        "deep_ensemble": lambda: Method(
            "deep_ensemble", baselines.deep_ensemble(single), baselines.stack(models)
        ),
        "mc_dropout": lambda: Method(
            "mc_dropout", baselines.mc_dropout(single, config.mc_dropout_samples), single.params
        ),
    }
    unknown = sorted(set(config.methods) - set(available))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; available: {sorted(available)}")
    return [available[name]() for name in config.methods]


def latency_batch(config: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    e = config.eval
    return random_tokens(np.random.default_rng(0), e.latency_batch, e.latency_tokens)


def evaluate(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Any]:
    """Evaluates every method; writes results.json, report.md, plots/ and predictions/."""
    workdir = Path(workdir)
    text = load_data(config)
    models = train(config, workdir, text, resume_only=True)
    timings_file = workdir / "train_timings.json"
    stages = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    return evaluate_methods(config, workdir, methods(config, models), text, stages)


def evaluate_methods(
    config: ml_collections.ConfigDict,
    workdir: Path,
    to_evaluate: list[Method],
    text: TextData,
    stages: dict[str, float],
) -> dict[str, Any]:
    """Predictions, metrics, costs and plots of each method; writes every artefact."""
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
