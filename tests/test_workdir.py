"""A workdir is held by one run at a time; the second is refused and the first loses nothing."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import (
    ablate_vit_fmnist,
    custom,
    hydra_minilm_mr,
    minilm_mr,
    prune_minilm_mr,
    vit_fmnist,
    zero_shot_fmnist,
)
from hydra_jax.experiments import engine, migrations
from hydra_jax.experiments import workdir as workdir_module
from hydra_jax.experiments.workdir import LOCK_FILE, Workdir, WorkdirError, flat

REPO = Path(__file__).parent.parent


def test_a_held_workdir_refuses_a_second_holder_and_is_free_after(tmp_path):
    workdir = tmp_path / "run"
    with Workdir(workdir).hold():
        (workdir / "checkpoint").write_text("the first run's work")
        held = rf"{workdir} is in use by process {os.getpid()} "
        with pytest.raises(WorkdirError, match=held), Workdir(workdir).hold():
            pass
    assert (workdir / "checkpoint").read_text() == "the first run's work"
    with Workdir(workdir).hold():  # released when its holder ends: no stale lock
        pass
    with Workdir(tmp_path / "absent").hold(create=False):
        pass
    assert not (tmp_path / "absent").exists()


def test_the_engine_itself_refuses_a_held_workdir(tmp_path):
    """`engine.train` and `engine.evaluate` (what the command line and the tests call) hold the
    workdir: on one a running `train.py` holds, they are refused, naming the holder, and touch
    nothing."""
    workdir = tmp_path / "run"
    config = minilm_mr.get_config("smoke")
    with Workdir(workdir).hold():  # as a running train.py holds it
        (workdir / "config.json").write_text("{}")
        held = rf"{workdir} is in use by process {os.getpid()} on "
        for stage in (engine.train, engine.evaluate):
            with pytest.raises(WorkdirError, match=held):
                stage(config, workdir)
    assert sorted(p.name for p in workdir.iterdir()) == [LOCK_FILE, "config.json"]
    with pytest.raises(ValueError, match="unknown stage 'predict'"):
        engine.run("predict", config, workdir)


@pytest.mark.processes
def test_a_second_train_py_on_a_running_workdir_is_refused(tmp_path):
    workdir = tmp_path / "run"
    with Workdir(workdir).hold():  # as a running train.py holds it
        (workdir / "config.json").write_text("{}")
        second = subprocess.run(
            [sys.executable, "train.py", "--config=configs/minilm_mr.py:smoke",
             f"--workdir={workdir}"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert second.returncode == 2, second.stderr
    assert f"error: {workdir} is in use by process {os.getpid()} on " in second.stderr
    assert sorted(p.name for p in workdir.iterdir()) == [LOCK_FILE, "config.json"]
    assert (workdir / "config.json").read_text() == "{}"


def test_a_run_recorded_under_a_renamed_key_is_still_its_configs(tmp_path):
    """Migration 1 -> 2: a key recorded under its old spelling is read under its new one."""
    config = prune_minilm_mr.get_config("smoke")
    recorded = json.loads(config.to_json())
    recorded["ood_limit"] = recorded.pop("data")["ood_limit"]  # the spelling before the rename
    recorded["eval_batch_size"] = recorded.pop("eval")["batch_size"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    Workdir(tmp_path).check(config)
    config.unlock()
    config.data.ood_limit += 1
    with pytest.raises(WorkdirError, match=r"data\.ood_limit: 48 -> 49"):
        Workdir(tmp_path).check(config)


def _lift(recorded: dict, group: str) -> None:
    """Moves the settings of `recorded[group]` to the top level, as a recorded config had them."""
    recorded.update(recorded.pop(group))


def _as_pruning(recorded: dict) -> None:
    _lift(recorded, "pruning_curves")
    del recorded["methods"], recorded["analyses"]


def _as_ablations(recorded: dict) -> None:
    _lift(recorded, "ablations")
    del recorded["methods"], recorded["analyses"]


def _as_zero_shot(recorded: dict) -> None:
    recorded.update(recorded.pop("zero_shot"))
    del recorded["enabled"]


@pytest.mark.parametrize(
    ("module", "before", "old_form"),
    [
        (minilm_mr, "baselines", None),
        (hydra_minilm_mr, "hydra", None),
        (custom, "custom", None),
        (hydra_minilm_mr, "study", None),
        (prune_minilm_mr, "pruning", _as_pruning),
        (ablate_vit_fmnist, "ablations", _as_ablations),
        (zero_shot_fmnist, "zero_shot", _as_zero_shot),
    ],
)
def test_a_run_of_a_study_before_the_engine_is_still_its_configs(
    module, before, old_form, tmp_path
):
    """Migration 0 -> 1: runs recorded `experiment` (the study kind) and, for some kinds,
    settings now grouped under the analysis or `zero_shot`: each is read as the engine config it
    became."""
    config = module.get_config("smoke")
    recorded = json.loads(config.to_json())
    assert "experiment" not in recorded
    recorded["experiment"] = before  # what the run recorded before the study engine
    if old_form:
        old_form(recorded)
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    Workdir(tmp_path).check(config)


def test_a_custom_run_recorded_before_its_analyses_is_still_its_configs(tmp_path):
    """Migration 2 -> 3: `configs/custom.py` gained `analyses` and their settings; a run recorded
    without them ran
    no analysis: it is the config that lists none, whatever those settings, and not one that
    lists an analysis."""
    config = custom.get_config("smoke")
    recorded = json.loads(config.to_json())
    for key in ("analyses", "pruning_curves", "ablations", "calibration_seed"):
        del recorded[key]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    config.ablations.sizes = (4,)
    Workdir(tmp_path).check(config)
    config.analyses = "ablations"
    with pytest.raises(WorkdirError, match=r"these keys differ \(recorded -> given\): analyses: "
                                           r"'' -> 'ablations'\. Use"):  # fmt: skip
        Workdir(tmp_path).check(config)


def test_settings_of_a_single_pass_ensemble_no_run_named_are_inert(tmp_path):
    """A vision run recorded before MIMO (no `mimo` settings, no `mimo` method) is still the
    config without the method, whatever its settings; and a BatchEnsemble's settings matter
    only where a run trained one."""
    config = vit_fmnist.get_config("smoke")
    config.methods = tuple(m for m in config.methods if m != "mimo")
    recorded = json.loads(config.to_json())
    del recorded["mimo"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    config.mimo.repetitions = 4
    Workdir(tmp_path).check(config)
    config.batch_ensemble.factor_std = 0.1  # the recorded run trained a BatchEnsemble
    with pytest.raises(WorkdirError, match=r"batch_ensemble.factor_std: 0.5 -> 0.1"):
        Workdir(tmp_path).check(config)
    config.batch_ensemble.factor_std = 0.5
    config.methods = (*config.methods, "mimo")
    with pytest.raises(WorkdirError, match=r"methods: "):
        Workdir(tmp_path).check(config)


def test_a_run_recorded_before_its_added_keys_is_still_its_configs(tmp_path):
    """Migration 3 -> 4: keys added later read, in a run recorded without them, as the value
    that reproduces it (`eval.dtype` float32, no held-out classes)."""
    config = custom.get_config("smoke")
    recorded = json.loads(config.to_json())
    del recorded["eval"]["dtype"], recorded["zero_shot"]["held_out"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    Workdir(tmp_path).check(config)
    config.eval.dtype = "bfloat16"
    with pytest.raises(WorkdirError, match=r"eval\.dtype: 'float32' -> 'bfloat16'"):
        Workdir(tmp_path).check(config)


def test_a_custom_run_recorded_with_the_old_hies_alphas_default_is_still_its_configs(tmp_path):
    """Migration 4 -> 5: the generic study recorded (0.25, 0.5, 0.75) where its default is now
    empty (the same alphas for 3 members); a run that gave other alphas is another config."""
    config = custom.get_config("smoke")
    recorded = json.loads(config.to_json()) | {"hies_alphas": [0.25, 0.5, 0.75], "schema": 4}
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    Workdir(tmp_path).check(config)
    assert Workdir(tmp_path).recorded().hies_alphas == [0.25, 0.5, 0.75]  # no `now` to follow
    recorded["hies_alphas"] = [0.3, 0.5, 0.7]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    with pytest.raises(WorkdirError, match=r"hies_alphas: \[0\.3, 0\.5, 0\.7\] -> \[\]"):
        Workdir(tmp_path).check(config)


@pytest.mark.parametrize(
    ("module", "members_from", "data_source"),
    [(minilm_mr, "checkpoint", "embedded"), (vit_fmnist, "scratch", "embedded"),
     (custom, "checkpoint", "files"), (prune_minilm_mr, "workdir", None)],
)  # fmt: skip
def test_a_run_recorded_before_its_sources_were_explicit_is_still_its_configs(
    module, members_from, data_source, tmp_path
):
    """Migration 5 -> 6: `members_from` and `data.source` are read from what the recorded
    config's shape said (a base workdir, a model architecture, an embedded `id_set`)."""
    config = module.get_config("smoke")
    assert config.members_from == members_from
    assert config.get("data", {}).get("source") == data_source
    recorded = json.loads(config.to_json())
    del recorded["members_from"]
    recorded.get("data", {}).pop("source", None)
    (tmp_path / "config.json").write_text(json.dumps(recorded | {"schema": 5}))
    Workdir(tmp_path).check(config)
    assert Workdir(tmp_path).recorded().members_from == members_from


def test_config_json_records_its_schema_and_migrations_start_there(tmp_path):
    """A new run writes today's schema; a recorded config is migrated from its own schema on
    (a key that was renamed before that schema is not renamed again), and one from a newer
    hydra_jax is refused, naming its schema."""
    config = prune_minilm_mr.get_config("smoke")
    Workdir(tmp_path).claim(config)
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded[migrations.SCHEMA_KEY] == migrations.SCHEMA
    Workdir(tmp_path).check(config)
    assert flat(Workdir(tmp_path).recorded()) == flat(config)  # the schema is not a setting
    recorded["ood_limit"] = recorded.pop("data")["ood_limit"]  # renamed in schema 2: not here
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    with pytest.raises(WorkdirError, match=r"data\.ood_limit: \(absent\) -> 48; ood_limit"):
        Workdir(tmp_path).check(config)
    recorded[migrations.SCHEMA_KEY] = 1  # the same keys, written before the rename
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    Workdir(tmp_path).check(config)
    assert Workdir(tmp_path).recorded().data.ood_limit == 48
    recorded[migrations.SCHEMA_KEY] = migrations.SCHEMA + 1
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    with pytest.raises(WorkdirError, match=rf"has schema {migrations.SCHEMA + 1}; this hydra_jax"):
        Workdir(tmp_path).check(config)


def test_a_run_of_another_study_kind_is_another_config(tmp_path):
    config = minilm_mr.get_config("smoke")
    recorded = json.loads(config.to_json()) | {"experiment": "pruning"}
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    with pytest.raises(WorkdirError, match=r"analyses: \['pruning_curves'\] -> \(absent\)"):
        Workdir(tmp_path).check(config)


def test_stages_are_timed_and_added_to_earlier_runs(tmp_path):
    first, second = Workdir(tmp_path), Workdir(tmp_path)
    with first.stage("train member 0"):
        pass
    first.save_stages()
    with second.stage("train member 0", record=False):  # restored: keeps the first run's time
        pass
    with second.stage("train member 1"):
        pass
    second.save_stages()
    timings = json.loads((tmp_path / "train_timings.json").read_text())
    assert list(timings) == ["train member 0", "train member 1"]
    assert timings["train member 0"] == first.stages["train member 0"]


def test_a_custom_run_recorded_before_streamed_images_is_still_its_configs(tmp_path):
    """Migration 7 -> 8: the generic study gained `data.skip_bad_images` (off reproduces an
    older run, which stopped at an undecodable image) and `data.cache`, which changes no result:
    a run may use another cache directory, or none."""
    config = custom.get_config("smoke")
    recorded = json.loads(config.to_json())
    del recorded["data"]["skip_bad_images"], recorded["data"]["cache"]
    (tmp_path / "config.json").write_text(json.dumps(recorded | {"schema": 7}))
    Workdir(tmp_path).check(config)
    config.data.cache = str(tmp_path / "pixels")
    Workdir(tmp_path).check(config)
    config.data.skip_bad_images = True
    with pytest.raises(WorkdirError, match=r"data\.skip_bad_images: False -> True"):
        Workdir(tmp_path).check(config)


def test_a_symlinked_lock_is_refused_and_its_target_left_alone(tmp_path):
    workdir, precious = tmp_path / "run", tmp_path / "precious.txt"
    workdir.mkdir()
    precious.write_text("precious")
    (workdir / LOCK_FILE).symlink_to(precious)
    with pytest.raises(WorkdirError, match=r"\.lock is a symbolic link"), Workdir(workdir).hold():
        pass
    assert precious.read_text() == "precious"


def test_a_file_system_without_locks_is_named_with_the_way_out(tmp_path, monkeypatch):
    """NFS mounted `nolock`: flock fails with ENOLCK (ENOSYS, Lustre's, is in tests/bad_inputs)."""

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(workdir_module.fcntl, "flock", no_locks)
    workdir = tmp_path / "run"
    no_lock = r"has no file locks .*workdir_lock=none"
    with pytest.raises(WorkdirError, match=no_lock), Workdir(workdir).hold():
        pass
    assert not workdir.exists()  # created here, left as it was
    with Workdir(workdir).hold(lock="none"):  # the user's explicit choice
        (workdir / "config.json").write_text("{}")
    assert sorted(p.name for p in workdir.iterdir()) == ["config.json"]
