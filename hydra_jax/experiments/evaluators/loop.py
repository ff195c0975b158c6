"""The one prediction loop: a method's outputs on every set its evaluators read, then their
metrics, predictions and plots."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import ml_collections

from hydra_jax.data import Dataset
from hydra_jax.ensembles.baselines import NoFeaturesError
from hydra_jax.evaluation import Method, predict
from hydra_jax.evaluation import softmax as to_probs
from hydra_jax.experiments.evaluators.base import Evaluator, Outputs, Predictions, Sets, Settings
from hydra_jax.experiments.evaluators.plots import method_plots
from hydra_jax.experiments.workdir import Workdir


def predictions_of(
    method: Method,
    sets: Sets,
    batch_size: int,
    needs: frozenset[str] = frozenset(),
    features_dtype: str = "float16",
    progress: bool = True,
) -> Predictions:
    """Member logits and probabilities `[N, M, C]` of `method` on the ID test set, each OOD set
    and shifted set; where `needs` says so, on the validation subset ("validation") and the
    member features `[N, M, F]` (in `features_dtype`) of the training subset, the ID test set
    and each OOD set ("features"), each from the same one pass as its logits."""
    features = "features" in needs
    if features and sets.train is None:
        raise ValueError("the feature detectors need a training set to fit on")

    def run(dataset: Dataset, with_features: bool) -> Outputs:
        nonlocal features
        if with_features and features:
            try:
                logits, feats = predict(method, dataset, batch_size, progress, features=True)
                return Outputs(logits, to_probs(logits), dataset.labels,
                               feats.astype(features_dtype))  # fmt: skip
            except NoFeaturesError:  # no features at all; the feature detectors say so
                features = False
        logits = predict(method, dataset, batch_size, progress)
        return Outputs(logits, to_probs(logits), dataset.labels)

    test = run(sets.test, features)
    ood = {name: run(s, features) for name, s in sets.ood.items()}
    shift = {name: run(s, False) for name, s in sets.shift.items()}
    validation = None
    if "validation" in needs and sets.validation is not None:
        validation = run(sets.validation, False)
    train = run(sets.train, True) if features and sets.train is not None else None
    if not features:  # the model gave none: keep none, so every set agrees
        test = Outputs(test.logits, test.probs, test.labels)
        ood = {n: Outputs(o.logits, o.probs) for n, o in ood.items()}
        train = None
    ood = {n: Outputs(o.logits, o.probs, None, o.features) for n, o in ood.items()}
    return Predictions(test, ood, shift, validation, train)


def needs_of(evaluators: Sequence[Evaluator]) -> frozenset[str]:
    """The prediction sets `evaluators` read beyond the ID test set (`predictions_of`)."""
    return frozenset().union(*(e.needs for e in evaluators))


def score(
    evaluators: Sequence[Evaluator], predictions: Predictions, method: Method | None
) -> dict[str, Any]:
    """Every evaluator's results on one method's predictions, under its key."""
    return {e.key: e(predictions, method) for e in evaluators}


def evaluate_methods(
    config: ml_collections.ConfigDict,
    workdir: Workdir,
    to_evaluate: Sequence[Method],
    sets: Sets,
    evaluators: Sequence[Evaluator],
) -> tuple[dict[str, Any], list[list[str]]]:
    """Predictions (`predictions/NAME.npz`) and plots of each method, and its results from
    every evaluator; returns each method's results (`results.json`'s `methods`) and every
    evaluator's report section."""
    results: dict[str, Any] = {}
    needs = needs_of(evaluators)
    dtype = Settings.of(config).features_dtype
    for method in to_evaluate:
        with workdir.stage(f"predict {method.name}"):
            predictions = predictions_of(method, sets, config.eval.batch_size, needs, dtype)
        workdir.write_arrays(workdir.at("predictions", method=method.name), predictions.arrays())
        workdir.write_plots(functools.partial(method_plots, method.name, predictions))
        results[method.name] = score(evaluators, predictions, method)
    return results, [e.section(results) for e in evaluators]
