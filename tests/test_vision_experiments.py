"""The vision study end to end on synthetic images: a tiny ViT trained from scratch and published
in HF format, the baselines with dataset shift, the Hydra experiment and pruning curves reading
the published directories."""

from __future__ import annotations

import json

import chex
import numpy as np
import pytest
from equivalences import saved_msp_run

import hydra_jax as hj
from configs import ablate_vit_fmnist, hydra_vit_fmnist, prune_vit_fmnist, vit_fmnist
from hydra_jax import metrics
from hydra_jax.experiments import ablations, engine

pytestmark = pytest.mark.slow  # studies end to end, meshes, several processes


@pytest.fixture(scope="module")
def vision_run(synthetic_image_dir, tmp_path_factory):
    config = vit_fmnist.get_config("smoke")
    config.ensemble_size = 2  # the variant's 3 cost the suite time
    # The BatchEnsemble runs in the text study (test_experiments.py) and the generic one
    # (test_custom_study.py); here the from-scratch branches: a LoRA-Ensemble on the trained
    # member 0, a Packed-Ensemble and MIMO of the ViT's architecture.
    config.methods = tuple(m for m in config.methods if m != "batch_ensemble")
    config.data_dir = str(synthetic_image_dir)
    config.train.update(epochs=6.0, learning_rate=3e-3)  # 48 steps on the synthetic squares
    workdir = tmp_path_factory.mktemp("vit")
    models = engine.train(config, workdir)["members"]
    return config, workdir, models, engine.evaluate(config, workdir)


def test_published_members_are_the_trained_models(vision_run):
    _, workdir, models, _ = vision_run
    for m, model in enumerate(models):
        directory = workdir / "hf" / f"member_{m}"
        assert json.loads((directory / "config.json").read_text())["architectures"] == [
            "ViTForImageClassification"
        ]
        assert (directory / "preprocessor_config.json").is_file()
        chex.assert_trees_all_equal(hj.from_pretrained(directory).params, model.params)
    assert not np.allclose(models[0].params["classifier"]["kernel"],
                           models[1].params["classifier"]["kernel"])  # fmt: skip


def test_vit_learns_the_synthetic_classes(vision_run):
    _, _, _, results = vision_run
    assert results["methods"]["single"]["id"]["acc"] > 0.5  # chance is 0.1


def test_mimo_runs_its_members_in_one_pass_of_one_network(vision_run):
    """MIMO, trained from scratch on the ViT's architecture: one network with M x the input
    channels and classes, `[B, M, C]` logits, that learns the classes; its parameter count
    follows the formula."""
    config, workdir, models, results = vision_run
    M = config.ensemble_size
    mimo = hj.load_model(workdir / "efficient" / "mimo")
    assert mimo.config.member == models[0].config and mimo.config.num_members == M
    assert mimo.params["patch"]["kernel"].shape[2] == M * models[0].config.num_channels
    assert np.load(workdir / "predictions" / "mimo.npz")["id_logits"].shape[1:] == (M, 10)
    assert results["methods"]["mimo"]["cost"]["params"] == hj.ensembles.parameter_count(mimo)
    assert results["methods"]["mimo"]["id"]["acc"] > 0.5  # chance is 0.1


def test_shift_metrics_are_recomputable_from_predictions(vision_run):
    config, workdir, _, results = vision_run
    shifts = [f"{c}_{s}" for c in config.data.corruptions for s in (1, 2, 3)]
    for name in config.methods:
        with np.load(workdir / "predictions" / f"{name}.npz") as npz:
            predictions = dict(npz)
        assert sorted(results["methods"][name]["shift"]) == sorted(shifts)
        for shift in shifts:
            recomputed = metrics.classification(
                predictions[f"shift_{shift}_probs"],
                predictions[f"shift_{shift}_labels"],
                config.eval.num_bins,
            )
            assert recomputed == results["methods"][name]["shift"][shift]
    report = (workdir / "report.md").read_text()
    assert "## Dataset shift" in report and "rotation_3" in report


def test_compare_draws_the_ood_sets_as_the_pooled_auroc_difference_with_shifted_sets(vision_run):
    """A study with shifted sets: their draws leave the mean OOD AUROC's interval exactly
    `metrics.pooled_auroc_difference`'s (they once shared its generator, moving every later
    seed's OOD draws)."""
    from hydra_jax.experiments import compare

    _, workdir, _, _ = vision_run
    a, b = "deep_ensemble", "single"
    (row,) = compare.compare([workdir, workdir], a, b, resamples=10, only=("ood.mean.auroc",))
    with np.load(workdir / "predictions" / f"{a}.npz") as npz:
        assert any(k.startswith("shift_") for k in npz.files)
    run = saved_msp_run(workdir, a, b)
    pooled = metrics.pooled_auroc_difference([run, run], resamples=10)
    assert (row.diff, row.diff_low, row.diff_high) == pytest.approx(
        (pooled["difference"], pooled["low"], pooled["high"]), abs=1e-12
    )


def test_hydra_and_pruning_run_on_the_published_vit(vision_run, tmp_path):
    config, workdir, _, _ = vision_run
    hydra_config = hydra_vit_fmnist.get_config("smoke")
    hydra_config.base_workdir = str(workdir)
    hydra_config.num_members = 2
    # Only the methods' strategy, circuit (a ViT's Taylor members: test_custom_study.py).
    hydra_config.strategies = ()
    hydra_config.methods = ("single", "deep_ensemble", "pruned_circuit", "hydra_circuit")
    engine.train(hydra_config, tmp_path / "hydra")
    results = engine.evaluate(hydra_config, tmp_path / "hydra")["methods"]
    assert results["hydra_circuit"]["cost"]["params"] < results["deep_ensemble"]["cost"]["params"]
    assert "shift" in results["hydra_circuit"]
    with np.load(tmp_path / "hydra" / "predictions" / "hydra_circuit.npz") as npz:
        assert npz["id_probs"].shape == (config.data.eval_limit, 2, 10)

    prune_config = prune_vit_fmnist.get_config("smoke")
    prune_config.base_workdir = str(workdir)
    prune_config.pruning_curves.criteria = ("random", "hies")
    engine.train(prune_config, tmp_path / "prune")
    curves = engine.evaluate(prune_config, tmp_path / "prune")["curves"]
    assert curves["hies"]["0.0"]["acc"] == curves["random"]["0.0"]["acc"]


def test_ablations_compare_averaged_and_per_member_mlps(vision_run, tmp_path):
    _, workdir, _, _ = vision_run
    config = ablate_vit_fmnist.get_config("smoke")
    config.base_workdir = str(workdir)
    config.ablations.strategies = ("stratified",)  # they differ only in head sets (test_hydra.py)
    engine.train(config, tmp_path)
    rows = engine.evaluate(config, tmp_path)["rows"]
    assert [(r["size"], r["strategy"], r["mlp"]) for r in rows] == [
        (2, "stratified", "per_member_mlp"), (2, "stratified", "averaged_mlp"),
        (3, "stratified", "per_member_mlp"), (3, "stratified", "averaged_mlp")]  # fmt: skip
    disjoint = [r for r in rows if r["strategy"] == "stratified"]
    assert all(r["overlap"] == 0.0 for r in disjoint)
    assert {r["heads_per_member"] for r in rows if r["size"] == 3} == {2}
    for size in (2, 3):  # one fused network holds fewer weights than the members side by side
        params = {r["mlp"]: r["params"] for r in disjoint if r["size"] == size}
        assert params["averaged_mlp"] < params["per_member_mlp"]
    assert (tmp_path / "plots" / "ensemble_size.png").is_file()


def test_overlap_is_the_mean_pairwise_jaccard_index():
    sets = np.array([[[1, 1, 0, 0]], [[0, 1, 1, 0]], [[0, 0, 1, 1]]], bool)
    # pairs: {0,1}&{1,2} = 1/3; {0,1}&{2,3} = 0; {1,2}&{2,3} = 1/3
    assert ablations.overlap(sets) == pytest.approx(2 / 9)
