"""The experiments end to end (train + evaluate stages) on the synthetic source with a tiny BERT
(MiniLM's real tokenizer, random 3-layer weights): artefacts, workdir ownership, the CLI."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import chex
import jax
import ml_collections
import numpy as np
import pytest
from equivalences import saved_msp_run
from launch import run_processes

import hydra_jax as hj
from configs import (
    ablate_vit_fmnist,
    custom,
    hydra_minilm_mr,
    hydra_vit_fmnist,
    minilm_mr,
    prune_minilm_mr,
    prune_vit_fmnist,
    vit_fmnist,
    zero_shot_fmnist,
)
from hydra_jax import metrics, testing
from hydra_jax.data import random_tokens
from hydra_jax.ensembles import STRATEGIES
from hydra_jax.evaluation import predict, softmax, xla_flops
from hydra_jax.experiments import cli, engine, evaluators, members, methods, plan, study_data
from hydra_jax.experiments.workdir import LOCK_FILE, Workdir, WorkdirError, flat
from hydra_jax.models import BertConfig, EncoderConfig
from hydra_jax.testing import assert_trained_params_close

pytestmark = pytest.mark.slow  # studies end to end, meshes, several processes

REPO = Path(__file__).parent.parent

L, N = 3, 4  # tiny: 3 layers of 4 heads (2 per member), width 20
# A bf16 evaluation of the smoke run against its fp32 results (96 test sentences: one changed
# prediction moves accuracy by 0.0104). Measured over single / deep_ensemble / mc_dropout: at most
# one changed prediction, NLL within 0.0005, ECE within 0.011, mean OOD AUROC within 0.0021.
BF16_TOLERANCE = {"acc": 0.021, "nll": 0.005, "ece": 0.02, "auroc": 0.01}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """An HF BERT directory: random weights, the real MiniLM tokenizer (its 30,522 ids)."""
    path = tmp_path_factory.mktemp("tiny_bert")
    config = BertConfig(
        EncoderConfig((N,) * L, 20, 5, 24, "gelu", 1e-12, pre_norm=False, dropout=0.1,
                      attention_dropout=0.1),
        vocab_size=30522, max_positions=40, type_vocab_size=2,
    )  # fmt: skip
    hj.save_pretrained(hj.Model.init(config, jax.random.key(0)), path)
    shutil.copy(hj.minilm_l6_path() / "tokenizer.json", path)
    return path


def smoke_config(data_dir, checkpoint) -> ml_collections.ConfigDict:
    config = minilm_mr.get_config("smoke")
    config.ensemble_size = 2  # the variant's 3 cost the suite time
    config.data_dir = str(data_dir)
    config.checkpoint = str(checkpoint)
    # A random tiny model: 60 steps; a checkpoint every 30 (few saves: each costs a file write).
    config.train.update(epochs=5.0, learning_rate=3e-3, checkpoint_every=30)
    # Every synthetic sentence in one padded length (97% have <= 16 tokens): one compiled
    # program per function, where 32 tokens would compile each for 16 and 32.
    config.data.max_tokens = 16
    return config


@pytest.fixture(scope="module")
def smoke_run(synthetic_data_dir, tiny_checkpoint, tmp_path_factory):
    config = smoke_config(synthetic_data_dir, tiny_checkpoint)
    workdir = tmp_path_factory.mktemp("smoke")
    engine.train(config, workdir)
    results = engine.evaluate(config, workdir)
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
        assert (workdir / "plots" / f"ood_curves_{name}.png").stat().st_size > 1000
        report = (workdir / "report.md").read_text()
        assert f"![{name}: reliability](plots/reliability_{name}.png)" in report
        assert f"![{name}: OOD curves](plots/ood_curves_{name}.png)" in report
        cost = results["methods"][name]["cost"]
        assert cost["params"] > 6e5 and cost["flops_per_example"] > 0 and cost["latency_ms"] > 0
    for seed in (0, 1):
        assert (workdir / "members" / f"member_{seed}" / "metrics.jsonl").is_file()


def test_results_record_the_config_they_were_evaluated_with(smoke_run):
    config, _, results = smoke_run
    assert flat(results["config"]) == flat(config)


def test_results_equal_metrics_recomputed_from_predictions(smoke_run):
    config, workdir, results = smoke_run
    for name in config.methods:
        with np.load(workdir / "predictions" / f"{name}.npz") as npz:
            predictions = dict(npz)
        members = {"single": 1, "mc_dropout": 3}.get(name, config.ensemble_size)
        assert predictions["id_probs"].shape == (96, members, 2)
        assert predictions["id_features"].shape[:2] == (96, members)
        assert predictions["id_features"].dtype == np.float32  # eval.features_dtype
        # Every evaluator's numbers, from the saved arrays alone (no model, no data).
        s = evaluators.Settings.of(config)
        ood_sets = tuple(config.data.ood_sets)
        groups = evaluators.ood_groups(config, ood_sets)
        assert groups == {"tweets": "near", "amazon_reviews": "near", "nyt_editorials": "far"}
        scoring = [
            evaluators.Classification(s.num_bins),
            evaluators.Calibration((), s.num_bins),
            evaluators.Selective(),
            evaluators.Conformal((), s.alpha, s.raps_penalty, s.raps_k),
            evaluators.OODDetection(
                ood_sets,
                tuple(evaluators.ood_scores(config)),
                groups,
                s.knn_k,
                s.vim_dim,
                s.covariance,
            ),
        ]
        recomputed = evaluators.score(
            scoring, evaluators.Predictions.from_arrays(predictions), None
        )
        for key, value in recomputed.items():
            assert value == results["methods"][name][key], (name, key)
        assert set(results["methods"][name]["ood"]) == {*ood_sets, "mean", "mean_near", "mean_far"}
        # And directly from the public metric functions, as a user would.
        acc = metrics.classification(predictions["id_probs"], predictions["labels"])["acc"]
        assert acc == results["methods"][name]["id"]["acc"]
        id_score = metrics.ood_score(predictions["id_probs"])
        tweets = metrics.ood(id_score, metrics.ood_score(predictions["ood_tweets_probs"]))
        assert tweets["auroc"] == results["methods"][name]["ood"]["tweets"]["auroc"]


def test_bf16_evaluation_of_the_smoke_run_is_close_to_fp32(smoke_run):
    """`eval.dtype = "bfloat16"`: the same trained models, every method's forward in bf16."""
    config, workdir, results = smoke_run
    study = engine.published(workdir, [0])[1].study
    trained = methods.Trained(Workdir(workdir), config, Workdir(workdir), dtype="bfloat16")
    for method in methods.build(config.methods, trained):

        def outputs(dataset, method=method):
            logits = predict(method, dataset, config.eval.batch_size, progress=False)
            return evaluators.Outputs(logits, softmax(logits), dataset.labels)

        ood = {name: outputs(s) for name, s in study.ood.items()}
        predictions = evaluators.Predictions(outputs(study.test), ood)
        scoring = [evaluators.Classification(), evaluators.OODDetection(tuple(study.ood))]
        low = evaluators.score(scoring, predictions, method)
        full = results["methods"][method.name]
        assert abs(low["id"]["acc"] - full["id"]["acc"]) <= BF16_TOLERANCE["acc"]
        assert abs(low["id"]["nll"] - full["id"]["nll"]) <= BF16_TOLERANCE["nll"]
        assert abs(low["id"]["ece"] - full["id"]["ece"]) <= BF16_TOLERANCE["ece"]
        auroc = low["ood"]["mean"]["auroc"] - full["ood"]["mean"]["auroc"]
        assert abs(auroc) <= BF16_TOLERANCE["auroc"]


def test_the_hydra_jax_command_runs_compare(smoke_run, capsys):
    _, workdir, _ = smoke_run
    argv = ["hydra-jax", "compare", str(workdir), "--a=deep_ensemble", "--b=single",
            "--resamples=5"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    assert "deep_ensemble vs single over 1 seeds" in capsys.readouterr().out


def test_mc_dropout_flops_count_every_sample(smoke_run):
    """XLA's cost analysis counts a `lax.map` body once; the reported FLOPs count all S samples,
    as XLA counts them when the samples are `vmap`ped instead."""
    config, workdir, results = smoke_run
    model = engine.published(workdir, [0])[0][0]
    keys = jax.random.split(jax.random.key(0), config.mc_dropout_samples)
    batch = random_tokens(np.random.default_rng(0), config.eval.latency_batch,
                          config.eval.latency_tokens)  # as cost() measured it  # fmt: skip

    def vmapped(params, batch):
        sample = lambda k: model.apply(params, **batch, dropout_rng=k).logits  # noqa: E731
        return jax.vmap(sample, out_axes=1)(keys)

    flops = xla_flops(jax.jit(vmapped).lower(model.params, batch).compile())
    per_example = flops / next(iter(batch.values())).shape[0]
    reported = results["methods"]["mc_dropout"]["cost"]["flops_per_example"]
    assert reported == pytest.approx(per_example, rel=0.05)


def test_single_pass_ensembles_add_parameters_and_lora_keeps_the_backbone(smoke_run):
    config, workdir, results = smoke_run
    cost = {name: r["cost"]["params"] for name, r in results["methods"].items()}
    assert cost["batch_ensemble"] > cost["single"] and cost["lora_ensemble"] > cost["single"]
    lora = hj.load_model(workdir / "efficient" / "lora_ensemble")
    frozen = hj.from_pretrained(config.checkpoint)  # the backbone stayed the checkpoint's
    chex.assert_trees_all_equal(lora.params["shared"], frozen.params)


def test_smoke_training_learns_the_synthetic_task(smoke_run):
    _, _, results = smoke_run
    # Sentiment words decide the synthetic labels; 60 steps beat chance clearly (0.95 here).
    assert results["methods"]["single"]["id"]["acc"] > 0.7


def test_config_is_locked_against_typos():
    config = minilm_mr.get_config()
    with pytest.raises(AttributeError, match="epochz"):
        config.train.epochz = 3
    with pytest.raises(ValueError, match="unknown config variant 'smok'"):
        minilm_mr.get_config("smok")


def test_ood_limit_caps_only_the_ood_test_sets(synthetic_data_dir, tiny_checkpoint):
    config = smoke_config(synthetic_data_dir, tiny_checkpoint)
    config.data.eval_limit = 0
    full = study_data.load_data(config)
    config.data.ood_limit = 7
    capped = study_data.load_data(config)
    assert len(capped.test) == len(full.test) > 7
    for name, ood in capped.ood.items():
        assert len(full.ood[name]) > 7 and len(ood) == 7
    config.data.eval_limit = 5  # both set: the smaller applies to the OOD sets
    both = study_data.load_data(config)
    assert len(both.test) == 5 and {len(o) for o in both.ood.values()} == {5}


@pytest.mark.parametrize(
    ("module", "budget"),
    [
        (minilm_mr, {"train.epochs", "data.train_limit", "data.eval_limit", "data.ood_limit",
                     "data.max_tokens", "eval.latency_repeats"}),
        (vit_fmnist, {"train.epochs", "data.train_limit", "data.eval_limit", "data.ood_limit",
                      "data.shift_limit", "eval.latency_repeats"}),
        (zero_shot_fmnist, {"train.epochs", "data.train_limit", "data.eval_limit",
                            "data.ood_limit", "circuit.examples", "eval.latency_repeats"}),
    ],
)  # fmt: skip
def test_demo_config_differs_from_the_default_only_in_its_budget(module, budget):
    default, demo = flat(module.get_config()), flat(module.get_config("demo"))
    assert demo.keys() == default.keys()
    changed = {key for key in default if default[key] != demo[key]}
    assert changed == {"title", *budget}


def test_a_study_seed_offsets_training_seeds_and_names_its_base_workdir():
    seeded = minilm_mr.get_config("demo,2")
    assert seeded.seed == 2 and members.training_seed(seeded, 1) == 2001
    assert members.training_seed(minilm_mr.get_config("demo"), 1) == 1
    assert hydra_minilm_mr.get_config("demo,2").base_workdir == "runs/demo_baselines_seed2"
    assert hydra_vit_fmnist.get_config(",1").base_workdir == "runs/vit_fmnist_seed1"


CONFIGS = [minilm_mr, hydra_minilm_mr, vit_fmnist, hydra_vit_fmnist, prune_minilm_mr,
           prune_vit_fmnist, ablate_vit_fmnist, zero_shot_fmnist, custom]  # fmt: skip


@pytest.mark.parametrize("module", CONFIGS)
def test_every_variant_of_every_config_can_run(module):
    """Each variant's methods, strategies, analyses and per-member settings fit together (a
    smoke variant with two HIES alphas for three members once failed after its members had
    trained)."""
    for variant in ("", "demo", "smoke"):
        try:
            config = module.get_config(variant)
        except ValueError:  # a config without this variant
            continue
        names, strategies, analyses = plan.check(config)
        assert (names or analyses) and set(strategies) <= set(STRATEGIES)
        assert set(analyses) <= set(engine.ANALYSES)


# ------------------------------------------------------------------ a workdir belongs to one config


def test_evaluate_on_a_missing_workdir_creates_nothing(
    synthetic_data_dir, tiny_checkpoint, tmp_path
):
    config = smoke_config(synthetic_data_dir, tiny_checkpoint)
    with pytest.raises(WorkdirError, match=r"no run of this experiment.*run train\.py"):
        engine.evaluate(config, tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_evaluate_on_an_unfinished_workdir_says_so(synthetic_data_dir, tiny_checkpoint, tmp_path):
    config = smoke_config(synthetic_data_dir, tiny_checkpoint)
    Workdir(tmp_path).claim(config)  # as a train.py killed before its first checkpoint
    with pytest.raises(WorkdirError, match="holds no published classifier of member 0"):
        engine.evaluate(config, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE, "config.json"]


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [("eval.batch_size", 0, "a positive integer"), ("eval.num_bins", -3, "a positive integer"),
     ("eval.latency_repeats", 0, "a positive integer"), ("ensemble_size", 0, "a positive integer"),
     ("data.train_limit", -1, "a non-negative integer"),
     ("data.max_tokens", 2, "an integer of at least 3")],
)  # fmt: skip
def test_counts_are_checked_before_the_workdir_is_claimed(
    synthetic_data_dir, tiny_checkpoint, tmp_path, key, value, kind
):
    config = smoke_config(synthetic_data_dir, tiny_checkpoint)
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
    with pytest.raises(ValueError, match=rf"{re.escape(key)} must be {kind}, got {value}"):
        Workdir(tmp_path / "run").claim(config)
    assert not (tmp_path / "run").exists()


def test_a_second_config_is_refused_and_config_json_kept(smoke_run):
    config, workdir, _ = smoke_run
    before = (workdir / "config.json").read_text()
    changed = ml_collections.ConfigDict(config.to_dict())
    changed.train.learning_rate = 1e-3
    changed.train.epochs = 4.0
    with pytest.raises(WorkdirError, match=r"train\.epochs: 5\.0 -> 4\.0; "
                       r"train\.learning_rate: 0\.003 -> 0\.001"):  # fmt: skip
        engine.train(changed, workdir)
    with pytest.raises(WorkdirError, match=r"train\.learning_rate"):
        engine.evaluate(changed, workdir)
    assert (workdir / "config.json").read_text() == before
    assert sorted(p.name for p in (workdir / "members" / "member_0" / "checkpoints").iterdir())
    retitled = ml_collections.ConfigDict(config.to_dict())
    retitled.title = "another title"  # cosmetic: accepted
    Workdir(workdir).check(retitled)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(synthetic_data_dir, tmp_path):
    path = tmp_path / "small_vocab"
    config = BertConfig(testing.encoder(layers=1, heads=2, head_dim=4, mlp_dim=8), 1000, 40, 2)
    hj.save_pretrained(hj.Model.init(config, jax.random.key(0)), path)
    shutil.copy(hj.minilm_l6_path() / "tokenizer.json", path)
    with pytest.raises(ValueError, match=r"tokenizer .* has 30522 tokens but the model's "
                       r"embedding table has 1000 rows"):  # fmt: skip
        engine.train(smoke_config(synthetic_data_dir, path), tmp_path / "run")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)  # fmt: skip


@pytest.mark.processes
def test_cli_names_the_settings_a_workdir_was_run_with(smoke_run):
    """evaluate.py with a setting its workdir was not trained with names the setting, both
    values. (An unknown key is a case of tests/bad_inputs/test_refuse_command_line.py.)"""
    config, workdir, _ = smoke_run
    overrides = [f"--config.data_dir={config.data_dir}", f"--config.checkpoint={config.checkpoint}",
                 "--config.ensemble_size=2", "--config.train.epochs=5",
                 "--config.train.learning_rate=0.01"]  # fmt: skip
    out = run_cli("evaluate.py", "--config=configs/minilm_mr.py:smoke", f"--workdir={workdir}",
                  *overrides)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "train.learning_rate: 0.003 -> 0.01" in out.stderr


# ------------------------------------------------------------------------- pruning and Hydra


def test_pruning_curves_smoke(smoke_run, tmp_path):
    _, workdir, _ = smoke_run
    config = prune_minilm_mr.get_config("smoke")
    config.base_workdir = str(workdir)
    config.pruning_curves.update(ratios=(0.0, 0.5), alphas=(0.0, 1.0))
    engine.train(config, tmp_path)  # scores the heads, chooses the alphas
    assert not (tmp_path / "predictions").exists()  # no methods
    results = engine.evaluate(config, tmp_path)
    assert "methods" not in results
    curves = results["curves"]
    assert set(curves) == {"random", "l2", "his", "ad", "hies"}
    unpruned = {c: curves[c]["0.0"] for c in curves}
    assert all(p["stability"] == 1.0 and p["heads_kept"] == L * N for p in unpruned.values())
    assert len({p["acc"] for p in unpruned.values()}) == 1  # ratio 0 is the same model
    assert curves["his"]["0.5"]["heads_kept"] == L * N // 2
    assert results["hies_alpha"]["0.5"] in (0.0, 1.0)
    assert (tmp_path / "plots" / "accuracy_vs_ratio.png").is_file()
    assert "Stability % (ours)" in (tmp_path / "report.md").read_text()


def test_hydra_smoke(smoke_run, tmp_path):
    _, workdir, baseline = smoke_run
    config = hydra_minilm_mr.get_config("smoke")
    config.base_workdir = str(workdir)
    config.num_members = 2
    config.strategies = ("stratified", "circuit", "taylor")
    config.methods = ("single", "pruned_taylor", "hydra_stratified", "hydra_circuit")
    config.fused_train.epochs = 0.25  # exercise fine-tuning the fused network too
    with pytest.raises(WorkdirError, match="no run of this experiment"):
        engine.evaluate(config, tmp_path)  # evaluate.py does not train: train.py first
    engine.train(config, tmp_path)
    results = engine.evaluate(config, tmp_path)
    assert set(results["methods"]) == set(config.methods)
    # The single model is the baseline run's, evaluated again: the same numbers.
    assert results["methods"]["single"]["id"] == baseline["methods"]["single"]["id"]
    sets = np.array(json.loads((tmp_path / "head_sets.json").read_text())["stratified"])
    assert sets.shape == (2, L, N) and np.all(sets.sum(0) == 1)  # disjoint, covering
    with np.load(tmp_path / "predictions" / "hydra_circuit.npz") as npz:
        assert npz["id_probs"].shape == (96, 2, 2)
    with np.load(tmp_path / "predictions" / "pruned_taylor.npz") as npz:
        assert npz["id_probs"].shape == (96, 1, 2)
    cost = {m: results["methods"][m]["cost"]["flops_per_example"] for m in config.methods}
    assert cost["pruned_taylor"] < cost["single"] < cost["hydra_circuit"] < 2 * cost["single"]
    assert (tmp_path / "fused" / "circuit" / "model_config.json").is_file()
    assert (tmp_path / "fused_training" / "circuit" / "metrics.jsonl").is_file()
    assert "fine-tune fused" in " ".join(results["stages"])  # the train stage's timings


def test_bad_training_settings_are_refused_before_the_workdir_is_claimed(smoke_run, tmp_path):
    """A refused setting must not be recorded: the corrected config would then conflict with
    the workdir. The fused network's settings are checked before any member trains."""
    _, workdir, _ = smoke_run
    fused = hydra_minilm_mr.get_config("smoke")
    fused.base_workdir = str(workdir)
    fused.fused_train.epochs = float("inf")
    members = ablate_vit_fmnist.get_config("smoke")
    members.base_workdir = str(workdir)
    members.member_train.learning_rate = float("nan")
    dual = zero_shot_fmnist.get_config("smoke")
    dual.train.batch_size = 0
    alphas = hydra_minilm_mr.get_config("smoke")
    alphas.base_workdir = str(workdir)
    alphas.hies_alphas = (0.3, 0.7)
    for config, message in [
        (fused, "train.epochs must be finite, got inf"),
        (alphas, "config.hies_alphas has 2 alphas for 3 members"),
        (members, "train.learning_rate must be finite, got nan"),
        (dual, "train.batch_size must be positive, got 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            engine.train(config, tmp_path / "never_claimed")
        assert not (tmp_path / "never_claimed").exists()


def test_rerunning_train_on_a_finished_run_keeps_its_timings(smoke_run):
    config, workdir, _ = smoke_run
    before = json.loads((workdir / "train_timings.json").read_text())
    engine.train(config, workdir)  # every member restored, none trained
    assert json.loads((workdir / "train_timings.json").read_text()) == before


@pytest.mark.processes
def test_cli_on_two_processes_equals_one_process(smoke_run, tmp_path):
    """train.py and evaluate.py of the smoke config on 2 processes x 2 CPU devices (one global
    data=2 x member=2 mesh): the same published member and metrics as the one-process run.
    The methods of member 0 alone (single, MC dropout's samples folded over `member`) train one
    member; the Deep Ensemble's second member would add a fourth to this test's time.
    tests/test_sharding.py runs the library's functions on 2 processes x 4 devices, the stacked
    Deep Ensemble's member split and training's save and resume across processes included."""
    config, workdir, results = smoke_run
    overrides = [
        f"--config.{k}={v}"
        for k, v in flat(config).items()
        if k in ("data_dir", "checkpoint", "data.max_tokens", "ensemble_size")
        or (k.startswith("train.") and k != "train.checkpoint_every")  # epochs, learning rate
    ]
    # One checkpoint, at the end (it changes no result): a save on two processes waits for
    # both; saving and resuming across processes is tests/test_sharding.py's.
    overrides.append("--config.train.checkpoint_every=1000")
    names = ("single", "mc_dropout")
    assert set(names) <= set(config.methods)
    overrides.append(f"--config.methods={names!r}")
    run = tmp_path / "run"
    for script in ("train.py", "evaluate.py"):
        run_processes(
            [sys.executable, script, "--config=configs/minilm_mr.py:smoke", f"--workdir={run}",
             *overrides, "--config.mesh.data=2", "--config.mesh.member=2",
             "--coordinator_address=localhost:{port}", "--num_processes=2",
             "--process_id={process_id}", "--distributed_timeout=60"],
            cwd=REPO, devices=2,
        )  # fmt: skip
    meshed = json.loads((run / "results.json").read_text())
    assert set(meshed["methods"]) == set(names)
    # Metrics of logits that agree to float32 rounding: NLL and ECE move by about 1e-6 of their
    # value; accuracy and AUROC are counts that change only if a prediction or an ordering ties
    # within rounding, which 1e-5 would report.
    for name in names:
        for key in ("acc", "nll", "ece"):
            assert meshed["methods"][name]["id"][key] == pytest.approx(
                results["methods"][name]["id"][key], abs=1e-5
            ), (name, key)
        assert meshed["methods"][name]["ood"]["mean"]["auroc"] == pytest.approx(
            results["methods"][name]["ood"]["mean"]["auroc"], abs=1e-5
        ), name
    assert not (run / "members" / "member_1").exists()  # no Deep Ensemble: one member trained
    log = run / "members" / "member_0" / "metrics.jsonl"  # one line per logged step, once
    steps = [json.loads(line)["step"] for line in log.open()]
    assert steps == sorted(set(steps)) and steps
    published = hj.from_pretrained(run / "hf" / "member_0")
    assert_trained_params_close(
        published.params, hj.from_pretrained(workdir / "hf" / "member_0").params
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"members_from": "hub"}, r"members_from is 'hub'; choose one of"),
     ({"members_from": "workdir"}, r"members_from is 'workdir' and base_workdir is None"),
     ({"members_from": "scratch"}, r"members_from is 'scratch', but config.model is a checkpoint"),
     ({"data.source": "web"}, r"data.source is 'web'; choose one of \('embedded', 'files'\)")],
)  # fmt: skip
def test_where_members_and_data_come_from_is_explicit_and_checked(changes, message, tmp_path):
    """`members_from` and `data.source` say where members and data come from; a value the other
    fields contradict is refused before anything is written."""
    config = minilm_mr.get_config("smoke")
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    with pytest.raises(ValueError, match=message):
        engine.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_compare_gives_every_metric_over_seeds_with_paired_intervals(smoke_run, tmp_path):
    """`hydra-jax compare` over two "seeds" (the smoke run twice): every evaluator's metric,
    per OOD set and detector too, with mean and std, and the mean OOD AUROC's interval exactly
    that of `metrics.pooled_auroc_difference` on the same draws."""
    from hydra_jax.experiments import compare

    _, workdir, results = smoke_run
    a, b = "deep_ensemble", "single"
    rows = compare.compare([workdir, workdir], a, b, resamples=20)
    by = {r.metric: r for r in rows}
    wanted = ["id.acc", "id.nll", "id.ece", "selective.aurc", "selective.augrc",
              "conformal.lac.test.coverage", "ood.tweets.by_score.msp.auroc"] + [
        f"ood.mean.by_score.{s}.auroc"
        for s in ("msp", "energy", "gen", "mahalanobis", "knn", "vim", "react", "kl_matching")
    ]  # fmt: skip
    assert not [m for m in wanted if m not in by]
    acc = by["id.acc"]
    assert (acc.a_mean, acc.b_mean) == (results["methods"][a]["id"]["acc"],
                                        results["methods"][b]["id"]["acc"])  # fmt: skip
    assert acc.a_std == 0 and acc.diff == acc.a_mean - acc.b_mean and acc.better == "higher"
    assert by["id.nll"].better == "lower" and by["conformal.lac.test.coverage"].better == ""
    assert math.isnan(by["cost.latency_ms"].diff_low)  # the cost: mean and std only
    run = saved_msp_run(workdir, a, b)
    pooled = metrics.pooled_auroc_difference([run, run], resamples=20)
    auroc = by["ood.mean.auroc"]
    assert (auroc.diff_low, auroc.diff_high) == pytest.approx((pooled["low"], pooled["high"]),
                                                              abs=1e-12)  # fmt: skip
    assert auroc.diff == pytest.approx(pooled["difference"], abs=1e-12)
    (alone,) = compare.compare([workdir, workdir], a, b, resamples=20, only=("ood.mean.auroc",))
    assert alone == auroc  # the OOD evaluator with MSP alone: the same draws, the same row
    same = compare.compare([workdir], a, a, resamples=3)
    assert all(r.diff == 0 and r.verdict in ("draw", "") for r in same)
    out = (tmp_path / "c.csv", tmp_path / "c.tex")
    argv = [str(workdir), str(workdir), "--a", a, "--b", b, "--csv", str(out[0]),
            "--latex", str(out[1]), "--resamples", "5"]  # fmt: skip
    assert compare.main(argv) == 0
    with open(out[0]) as file:
        table = list(csv.DictReader(file))
    assert list(table[0])[:8] == ["metric", "a_mean", "a_std", "b_mean", "b_std", "diff",
                                  "diff_low", "diff_high"]  # fmt: skip
    assert {row["metric"] for row in table} == set(by)
    tex = out[1].read_text()
    assert "\\toprule" in tex and "id.acc".replace("_", "\\_") in tex and "$\\pm$" in tex
    assert compare.main([str(workdir), "--a", a, "--b", "nothing"]) == 2


def test_a_finished_workdir_is_plotted_again_from_its_files(smoke_run, tmp_path):
    """`hydra-jax plot`: the plots from `results.json` and `predictions/` alone."""
    import shutil

    from hydra_jax.experiments.evaluators import plots

    _, workdir, results = smoke_run
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copy(workdir / "results.json", copy)
    shutil.copytree(workdir / "predictions", copy / "predictions")
    written = {p.name for p in plots.replot(copy)}
    for name in results["methods"]:
        assert {f"reliability_{name}.png", f"ood_curves_{name}.png"} <= written
    assert plots.COST_PLOT in written and (workdir / "plots" / plots.COST_PLOT).is_file()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["hydra-jax", "plot", str(tmp_path / "nothing")])
    assert exit_.value.code == 2
