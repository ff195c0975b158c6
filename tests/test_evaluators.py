"""The evaluation a config declares: evaluators, OOD scores, their settings and OOD groups are
refused by name before any training when unknown or inconsistent."""

from __future__ import annotations

import numpy as np
import pytest

from configs import (
    custom,
    hydra_minilm_mr,
    hydra_vit_fmnist,
    minilm_mr,
    prune_minilm_mr,
    prune_vit_fmnist,
    vit_fmnist,
    zero_shot_fmnist,
)
from hydra_jax.experiments import evaluators, plan, pruning, workdir


def _custom(**fields):
    config = custom.get_config("smoke")
    config.update(model="/tmp/model", members_from="checkpoint")
    config.data.update(train="csv:train.csv", test="csv:test.csv", ood="news=csv:news.csv")
    for key, value in fields.items():
        group, _, name = key.rpartition(".")
        (config[group] if group else config)[name] = value
    return config


def test_the_studies_declare_every_evaluator_and_score():
    for config in (minilm_mr.get_config("demo"), hydra_vit_fmnist.get_config("demo")):
        plan.check(config)
        assert evaluators.names(config) == list(evaluators.EVALUATORS)
        assert evaluators.ood_scores(config) == list(evaluators.OOD_SCORES)
    assert evaluators.names(_custom()) == list(evaluators.EVALUATORS)  # empty: all
    assert evaluators.ood_groups(minilm_mr.get_config(), ["tweets"]) == {"tweets": "near"}
    assert evaluators.ood_groups(_custom(), ["news"]) == {}  # your files: none unless given
    groups = evaluators.ood_groups(_custom(**{"data.ood_groups": "news=far"}), ["news"])
    assert groups == {"news": "far"}


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"evaluators": "classification,calibrate"}, r"unknown \['calibrate'\]; known: classif"),
        ({"ood_scores": "msp,mahalanobis_distance"}, r"unknown \['mahalanobis_distance'\]"),
        ({"evaluators": "calibration"}, "calibrate on an ID validation split"),
        ({"evaluators": "conformal"}, "calibrate on an ID validation split"),
        ({"eval.alpha": 1.5}, r"eval.alpha must lie in \(0, 1\)"),
        ({"eval.raps_penalty": -0.1}, "eval.raps_penalty must be >= 0"),
        ({"eval.features_dtype": "int8"}, "float16 or float32"),
        ({"data.ood_groups": "news=middle"}, "is not NAME=near or NAME=far"),
        ({"data.ood_groups": "sports=near"}, "names 'sports', not an OOD set"),
        ({"data.ood": "mean_far=csv:far.csv"}, "names starting with 'mean'"),
    ],
)
def test_a_bad_evaluation_is_refused_before_training(fields, match):
    with pytest.raises(ValueError, match=match):
        plan.check(_custom(**fields))


@pytest.mark.parametrize(
    "key, value", [("eval.knn_k", 0), ("eval.vim_dim", -1), ("eval.calibration_limit", -1)]
)
def test_a_bad_evaluation_count_is_refused_before_the_workdir_is_claimed(key, value):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        workdir.check_counts(_custom(**{key: value}))


def test_a_validation_split_allows_temperature_scaling_and_conformal():
    plan.check(_custom(**{"data.validation": "csv:val.csv", "evaluators": "calibration"}))


@pytest.mark.parametrize(
    "module", [minilm_mr, hydra_minilm_mr, vit_fmnist, hydra_vit_fmnist, zero_shot_fmnist]
)
def test_each_study_config_declares_every_evaluation_setting(module):
    """The configs write their settings out (they import no engine code); none may be missing,
    or a `--config.eval.X=` override would be refused."""
    for variant in ("", "smoke"):
        config = module.get_config(variant)
        assert set(evaluators.eval_fields()) <= set(config.eval), module.__name__


@pytest.mark.parametrize("module", [prune_minilm_mr, prune_vit_fmnist])
def test_the_pruning_configs_declare_the_analysis_defaults(module):
    for variant, smoke in (("", False), ("smoke", True)):
        got = module.get_config(variant).pruning_curves.to_dict()
        assert got == pruning.default_config(smoke).to_dict(), (module.__name__, variant)


def test_predictions_round_trip_through_their_arrays_with_shifted_sets_of_any_size():
    """`predictions/NAME.npz` holds each shifted set's own labels: the generic study's sets
    differ in size and labels."""
    rng = np.random.default_rng(0)

    def outputs(n: int, labelled: bool = True) -> evaluators.Outputs:
        logits = rng.normal(size=(n, 2, 3)).astype(np.float32)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        return evaluators.Outputs(logits, probs, rng.integers(0, 3, n) if labelled else None)

    predictions = evaluators.Predictions(
        outputs(6), {"far": outputs(4, False)}, {"blur": outputs(5), "typos": outputs(3)}
    )
    again = evaluators.Predictions.from_arrays(predictions.arrays())
    for name in ("blur", "typos"):
        np.testing.assert_array_equal(again.shift[name].labels, predictions.shift[name].labels)
        np.testing.assert_array_equal(again.shift[name].probs, predictions.shift[name].probs)
    assert again.ood["far"].labels is None and len(again.id.labels) == 6
