"""The smoke config end to end (train + evaluate) on the synthetic source with the real MiniLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import traverse_util

from hydra_jax import hydra_pipeline, metrics, pipeline, pruning
from hydra_jax.evaluation import method_metrics

sys.path.insert(0, str(Path(__file__).parent.parent))
from configs import hydra_minilm_mr, minilm_mr, prune_minilm_mr


@pytest.fixture(scope="module")
def smoke_run(synthetic_data_dir, tmp_path_factory):
    config = minilm_mr.get_config("smoke")
    config.data_dir = str(synthetic_data_dir)
    workdir = tmp_path_factory.mktemp("smoke")
    pipeline.train(config, workdir)
    results = pipeline.evaluate(config, workdir)
    return config, workdir, results


def test_every_artefact_exists(smoke_run):
    config, workdir, results = smoke_run
    assert json.loads((workdir / "results.json").read_text()) == results
    assert (workdir / "report.md").read_text().startswith("# MiniLM-L6")
    assert json.loads((workdir / "config.json").read_text())["ensemble_size"] == 2
    for name in config.methods:
        assert (workdir / "predictions" / f"{name}.npz").is_file()
        assert (workdir / "plots" / f"reliability_{name}.png").stat().st_size > 1000
        assert (workdir / "plots" / f"ood_scores_{name}.png").stat().st_size > 1000
        cost = results["methods"][name]["cost"]
        assert cost["params"] > 2e7 and cost["flops_per_example"] > 0 and cost["latency_ms"] > 0
    for seed in (0, 1):
        assert (workdir / "members" / f"seed_{seed}" / "metrics.jsonl").is_file()


def test_results_equal_metrics_recomputed_from_predictions(smoke_run):
    config, workdir, results = smoke_run
    for name in config.methods:
        with np.load(workdir / "predictions" / f"{name}.npz") as npz:
            predictions = dict(npz)
        members = {"single": 1, "deep_ensemble": 2, "mc_dropout": 3}[name]
        assert predictions["id_probs"].shape == (96, members, 2)
        recomputed = method_metrics(predictions, list(config.data.ood_sets))
        assert recomputed["id"] == results["methods"][name]["id"]
        assert recomputed["ood"] == results["methods"][name]["ood"]
        # And directly from the public metric functions, as a user would.
        acc = metrics.classification(predictions["id_probs"], predictions["labels"])["acc"]
        assert acc == results["methods"][name]["id"]["acc"]
        id_score = metrics.ood_score(predictions["id_probs"])
        tweets = metrics.ood(id_score, metrics.ood_score(predictions["ood_tweets_probs"]))
        assert tweets["auroc"] == results["methods"][name]["ood"]["tweets"]["auroc"]


def test_compare_reports_the_paired_auroc_difference(smoke_run):
    _, workdir, results = smoke_run
    repo = Path(__file__).parent.parent
    command = [sys.executable, str(repo / "compare.py"), f"--workdir={workdir}",
               "--a=deep_ensemble", "--b=single", "--resamples=20"]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    mean = {
        m: 100 * results["methods"][m]["ood"]["mean"]["auroc"] for m in ("deep_ensemble", "single")
    }
    assert f"deep_ensemble: mean OOD AUROC {mean['deep_ensemble']:.2f}" in out
    assert f"deep_ensemble - single: {mean['deep_ensemble'] - mean['single']:+.2f} points" in out


def test_smoke_training_learns_the_synthetic_task(smoke_run):
    _, _, results = smoke_run
    # Sentiment words decide the synthetic labels; 12 steps already beat chance clearly.
    assert results["methods"]["single"]["id"]["acc"] > 0.7


def test_config_is_locked_against_typos():
    config = minilm_mr.get_config()
    with pytest.raises(AttributeError, match="epochz"):
        config.train.epochz = 3
    with pytest.raises(ValueError, match="unknown config variant 'smok'"):
        minilm_mr.get_config("smok")


def test_ood_limit_caps_only_the_ood_test_sets(synthetic_data_dir):
    config = minilm_mr.get_config("smoke")
    config.data_dir = str(synthetic_data_dir)
    config.data.eval_limit = 0
    full = pipeline.load_data(config)
    config.data.ood_limit = 7
    capped = pipeline.load_data(config)
    assert len(capped.test.tokens) == len(full.test.tokens) > 7
    for name, ood in capped.ood.items():
        assert len(full.ood[name].tokens) > 7 and len(ood.tokens) == 7
    config.data.eval_limit = 5  # both set: the smaller applies to the OOD sets
    both = pipeline.load_data(config)
    assert len(both.test.tokens) == 5 and {len(o.tokens) for o in both.ood.values()} == {5}


def test_demo_config_differs_from_the_default_only_in_its_budget():
    default = traverse_util.flatten_dict(minilm_mr.get_config().to_dict())
    demo = traverse_util.flatten_dict(minilm_mr.get_config("demo").to_dict())
    assert demo.keys() == default.keys()
    changed = {path for path in default if default[path] != demo[path]}
    assert changed == {("title",), ("train", "epochs"), ("data", "ood_limit")}


def test_evaluate_refuses_an_untrained_workdir(synthetic_data_dir, tmp_path):
    config = minilm_mr.get_config("smoke")
    config.data_dir = str(synthetic_data_dir)
    with pytest.raises(FileNotFoundError, match="no finished training run"):
        pipeline.evaluate(config, tmp_path)


def test_pruning_curves_smoke(smoke_run, tmp_path):
    _, workdir, _ = smoke_run
    config = prune_minilm_mr.get_config("smoke")
    config.base_workdir = str(workdir)
    config.ratios = (0.0, 0.5)
    config.alphas = (0.0, 1.0)
    results = pruning.run(config, tmp_path)
    curves = results["curves"]
    assert set(curves) == {"random", "l2", "his", "ad", "hies"}
    unpruned = {c: curves[c]["0.0"] for c in curves}
    assert all(p["stability"] == 1.0 and p["heads_kept"] == 72 for p in unpruned.values())
    assert len({p["acc"] for p in unpruned.values()}) == 1  # ratio 0 is the same model
    assert curves["his"]["0.5"]["heads_kept"] == 36
    assert results["hies_alpha"]["0.5"] in (0.0, 1.0)
    assert (tmp_path / "plots" / "accuracy_vs_ratio.png").is_file()
    assert "Stability % (ours)" in (tmp_path / "report.md").read_text()


def test_hydra_smoke(smoke_run, tmp_path):
    _, workdir, baseline = smoke_run
    config = hydra_minilm_mr.get_config("smoke")
    config.base_workdir = str(workdir)
    config.strategies = ("stratified", "circuit")
    config.methods = ("single", "hydra_stratified", "hydra_circuit")
    config.fused_train.epochs = 0.25  # exercise fine-tuning the fused network too
    results = hydra_pipeline.run(config, tmp_path)
    assert set(results["methods"]) == set(config.methods)
    # The single model is the baseline run's, evaluated again: the same numbers.
    assert results["methods"]["single"]["id"] == baseline["methods"]["single"]["id"]
    sets = np.array(json.loads((tmp_path / "head_sets.json").read_text())["stratified"])
    assert sets.shape == (2, 6, 12) and np.all(sets.sum(0) == 1)  # disjoint, covering
    with np.load(tmp_path / "predictions" / "hydra_circuit.npz") as npz:
        assert npz["id_probs"].shape == (96, 2, 2)
    hydra_cost = results["methods"]["hydra_circuit"]["cost"]["flops_per_example"]
    single_cost = results["methods"]["single"]["cost"]["flops_per_example"]
    assert single_cost < hydra_cost < 2 * single_cost
    assert (tmp_path / "fused" / "circuit" / "hydra_config.json").is_file()
    assert (tmp_path / "fused_training" / "circuit" / "metrics.jsonl").is_file()
