"""`hydra-jax plan`: a config's programs compiled, not run, for 8 CPU devices and, where libtpu
is installed (the lock has it), for a TPU topology from this CPU; bad targets and meshes refused
with the fix."""

from __future__ import annotations

import importlib.util
import json
import re

import jax
import pytest

import hydra_jax as hj
from configs.paper import bert_base_sst2, vit_b16_imagenet
from hydra_jax.experiments import aot, cli

pytestmark = pytest.mark.slow  # a few dozen compilations

KINDS = {"single", "deep_ensemble", "hydra", "batch_ensemble", "lora_ensemble"}  # :smoke plans all
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def test_the_command_plans_every_method_on_8_cpu_devices(tmp_path, capsys):
    """The table and `--json`: every method's programs divide their work (a CPU has no chip
    figures: no memory limit, no roofline)."""
    out = tmp_path / "plan.json"
    config = "configs/paper/vit_b16_imagenet.py:smoke"
    argv = [
        "--config",
        config,
        "--target",
        "cpu:8",
        "--mesh",
        "data=4,member=2",
        "--json",
        str(out),
    ]
    assert aot.main(argv) == 0
    assert "| hydra | train_step |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["target"] == "cpu:8" and result["devices"] == 8
    assert result["mesh"] == {"data": 4, "member": 2, "heads": 1}
    rows = {(r["method"], r["program"]): r for r in result["rows"]}
    assert {m for m, _ in rows} == KINDS
    assert {m for m, p in rows if p == "predict"} == KINDS
    assert {m for m, p in rows if p == "train_step"} == KINDS - {"deep_ensemble"}
    for key, row in rows.items():
        assert set(row) == {
            "method", "program", "flops_per_device", "bytes_per_device", "argument_bytes",
            "output_bytes", "temp_bytes", "fits", "hbm_bytes", "roofline_ms", "work_split",
        }  # fmt: skip
        assert 0 < row["work_split"] <= 1.10, (key, row["work_split"])
        assert row["fits"] is None and row["roofline_ms"] is None
        assert row["flops_per_device"] > 0 and row["temp_bytes"] >= 0


@pytest.mark.parametrize(
    ("target", "mesh", "match"),
    [
        ("gpu:8", "", "give cpu:N or a TPU topology"),
        ("cpu:0", "", "give cpu:N with N devices"),
        ("cpu:64", "", "set JAX_NUM_CPU_DEVICES=64"),
        ("cpu:8", "data=3", "has 3 places, the target 8 devices"),
        ("cpu:8", "rows=8", r"mesh axes \['rows'\]"),
        ("cpu:8", "data:8", "give AXIS=SIZE"),
    ],
)
def test_a_bad_target_or_mesh_is_refused_with_the_fix(target, mesh, match, capsys):
    config = "configs/paper/vit_b16_imagenet.py:smoke"
    assert len(jax.devices()) == 8  # the backend has started (conftest): cpu:64 cannot be had
    assert aot.main(["--config", config, "--target", target, "--mesh", mesh]) == 2
    assert re.search(match, capsys.readouterr().err)  # one line, no traceback
    with pytest.raises(ValueError, match=match):
        aot.plan(aot.load_config(config), target, aot.mesh_argument(mesh))


def test_a_tpu_target_without_libtpu_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r'pip install "hydra_jax\[tpu\]"'):
        aot.target_devices("v5e:2x4")


def test_the_paper_configs_plan_their_real_sizes():
    """Their shapes only (no compilation): ViT-B/16 and BERT-base, Hydra members of 6 heads."""
    for module, params in ((vit_b16_imagenet, 86.6e6), (bert_base_sst2, 109.5e6)):
        models = aot.methods(module.get_config())
        single = models["single"][0]
        count = sum(x.size for x in jax.tree.leaves(single.params))
        assert abs(count - params) / params < 0.01, (module.__name__, count)
        hydra = models["hydra"][0]
        assert hydra.config.num_members == 4
        assert hydra.config.member.encoder.num_heads == (6,) * 12


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (hydra_jax[tpu])")
def test_a_tpu_topology_compiles_from_this_cpu():
    config = vit_b16_imagenet.get_config("smoke")
    with config.unlocked():
        config.plan.methods = "single,hydra"  # each TPU compilation takes seconds here
    result = aot.plan(config, "v5e:2x4", {"data": 8})
    assert {r["method"] for r in result["rows"]} == {"single", "hydra"}
    assert result["devices"] == 8
    for row in result["rows"]:
        assert row["fits"] is True and row["hbm_bytes"] == aot.CHIPS["v5e"][1]
        assert row["roofline_ms"] > 0 and row["work_split"] > 0


def test_the_hydra_jax_command_dispatches_plan(capsys):
    config = "configs/paper/vit_b16_imagenet.py:smoke"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["hydra-jax", "plan", "--config", config, "--target", "tpu9:1"])
    assert exit_.value.code == 2
    assert "give cpu:N or a TPU topology" in capsys.readouterr().err
    assert aot.main(["--config", "no/such.py", "--target", "cpu:8"]) == 2
    assert "no config file at no/such.py" in capsys.readouterr().err


def test_the_docs_table_of_a_plan_gives_the_hydras_ratios():
    """scripts/plan_table.py: one row per method and program, and Hydra / single and Hydra /
    Deep Ensemble ratios of each program's FLOPs and roofline time."""
    from scripts import plan_table

    def row(method, program, flops, ms):
        return {"method": method, "program": program, "flops_per_device": flops,
                "bytes_per_device": 2 * flops, "argument_bytes": 1, "output_bytes": 1,
                "temp_bytes": 1, "fits": True, "hbm_bytes": 9, "roofline_ms": ms,
                "work_split": 1.0}  # fmt: skip

    plan = {"rows": [row("single", "predict", 2e9, 4.0), row("deep_ensemble", "predict", 8e9, 16.0),
                     row("hydra", "predict", 5e9, 8.0)]}  # fmt: skip
    rows = {(r["method"], r["program"]): r for r in plan_table.rows(plan)}
    assert rows[("hydra / single", "predict")]["gflop"] == 2.5
    assert rows[("hydra / single", "predict")]["roofline"] == 2.0
    assert rows[("hydra / deep_ensemble", "predict")]["gflop"] == 0.625
    assert ("hydra / single", "train_step") not in rows  # no train_step rows to compare
    single = rows[("single", "predict")]
    assert single["fits"] == "yes" and single["gflop"] == 2 and single["moved"] == 4


def test_hj_plan_takes_a_config_as_the_command_does():
    config = vit_b16_imagenet.get_config("smoke")
    with config.unlocked():
        config.plan.methods = "single"
    result = hj.plan(config, "cpu:8", {"data": 8})
    assert [(r["method"], r["program"]) for r in result["rows"]] == [
        ("single", "predict"),
        ("single", "train_step"),
    ]
    assert all(r["work_split"] <= 1.10 for r in result["rows"])
