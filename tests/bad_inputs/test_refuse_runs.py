"""Training settings, study configs, workdirs and meshes refused before anything is written."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from unittest import mock

import jax
import ml_collections
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax.data import TextEncoder, TokenizedSet
from hydra_jax.experiments import engine
from hydra_jax.experiments import workdir as workdir_module
from hydra_jax.experiments.workdir import LOCK_FILE, Workdir, WorkdirError
from hydra_jax.models import sharding
from hydra_jax.training import TrainSettings, fit


def study(**fields) -> ml_collections.ConfigDict:
    """A study config of default training settings and `fields`."""
    return ml_collections.ConfigDict({"train": {}, **fields})


def conflict(tmp: Path):
    Workdir(tmp / "owned").claim(ml_collections.ConfigDict({"a": 1}))
    Workdir(tmp / "owned").claim(ml_collections.ConfigDict({"a": 2}))


def as_two_processes(call):
    """`call()` as process 0 of 2, seen from one process: its devices stand in for the global
    devices, as every 2-process run has."""
    with mock.patch.object(jax, "process_count", lambda: 2):
        return call()


def hold_with_lock(workdir: Path, make_lock, mode: str = "flock") -> None:
    """Holds `workdir` by `mode`, its `.lock` made by `make_lock(path)`: a FIFO, a directory."""
    workdir.mkdir()
    make_lock(workdir / LOCK_FILE)
    with Workdir(workdir).hold(lock=mode):
        pass


def hold_without_locks(workdir: Path, code: int) -> None:
    """Holds `workdir` on a file system whose flock fails with `code` (Lustre without
    `-o flock`: ENOSYS)."""

    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    with mock.patch.object(workdir_module.fcntl, "flock", no_locks), Workdir(workdir).hold():
        pass


CASES = [
    pytest.param(
        lambda c: TrainSettings(batch_size=0), ValueError, "train.batch_size", id="batch size 0"
    ),
    pytest.param(
        lambda c: Workdir(c.tmp / "never_claimed").claim(
            ml_collections.ConfigDict({"eval": {"batch_size": 0}})
        ),
        ValueError,
        "eval.batch_size must be a positive integer",
        id="evaluation batch size 0 in a config",
    ),
    pytest.param(
        lambda c: Workdir(c.tmp / "never_claimed").claim(
            ml_collections.ConfigDict({"data": {"train_limit": -1}})
        ),
        ValueError,
        "data.train_limit must be a non-negative integer",
        id="a negative train_limit in a config",
    ),
    pytest.param(
        lambda c: TokenizedSet(list(c.ids), c.labels[:2]),
        ValueError,
        "labels must be [N], one per token array",
        id="a token set with fewer labels than sentences",
    ),
    pytest.param(
        lambda c: TextEncoder(hj.minilm_l6_path(), max_tokens=1),
        ValueError,
        "max_tokens ([CLS], a token, [SEP]) must be an integer of at least 3",
        id="a token cap below [CLS] and [SEP]",
    ),
    pytest.param(
        lambda c: fit(
            c.bert,
            TokenizedSet(list(c.ids), np.array([0, -1, 1])),
            TrainSettings(batch_size=2),
            c.tmp / "never_written",
        ),
        ValueError,
        "training set: labels must be classes in",
        id="OOD examples (label -1) in a training set",
    ),
    pytest.param(
        lambda c: TrainSettings(epochs=-1.0), ValueError, "train.epochs", id="negative epochs"
    ),
    pytest.param(
        lambda c: TrainSettings(checkpoint_every=0),
        ValueError,
        "train.checkpoint_every",
        id="checkpoint every 0",
    ),
    pytest.param(
        lambda c: TrainSettings(warmup_fraction=1.0),
        ValueError,
        "train.warmup_fraction",
        id="warm-up fraction 1",
    ),
    pytest.param(
        lambda c: TrainSettings(learning_rate=-0.001),
        ValueError,
        "train.learning_rate",
        id="negative learning rate",
    ),
    pytest.param(
        lambda c: TrainSettings(batch_size=2.5),
        ValueError,
        "train.batch_size must be an integer",
        id="fractional batch size",
    ),
    pytest.param(
        lambda c: TrainSettings(epochs=np.inf),
        ValueError,
        "train.epochs must be finite",
        id="infinite epochs",
    ),
    pytest.param(
        lambda c: TrainSettings(learning_rate=np.nan),
        ValueError,
        "train.learning_rate must be finite",
        id="NaN learning rate",
    ),
    pytest.param(
        lambda c: Workdir(c.tmp / "none").check(ml_collections.ConfigDict({"a": 1})),
        WorkdirError,
        "no run of this experiment",
        id="evaluate a missing workdir",
    ),
    pytest.param(
        lambda c: conflict(c.tmp), WorkdirError, "a: 1 -> 2", id="workdir of another config"
    ),
    pytest.param(
        lambda c: engine.train(study(methods=("single", "nope")), c.tmp / "never_claimed"),
        ValueError,
        "methods: ['nope']; known:",
        id="an unknown method among the members' methods",
    ),
    pytest.param(
        lambda c: engine.train(study(methods=("hydra_taylr",)), c.tmp / "never_claimed"),
        ValueError,
        "methods: ['hydra_taylr']; known:",
        id="an unknown Hydra method",
    ),
    pytest.param(
        lambda c: engine.train(
            study(methods=("single", "deep_ensemble"), zero_shot={"enabled": True}),
            c.tmp / "never_claimed",
        ),
        ValueError,
        "zero_shot.enabled trains no classifier, so ['deep_ensemble'] cannot run",
        id="a method that trains in a zero-shot study",
    ),
    pytest.param(
        lambda c: engine.train(study(methods=(), analyses="pruning_curvs"), c.tmp / "never"),
        ValueError,
        "config.analyses: ['pruning_curvs']; known: pruning_curves, ablations",
        id="an unknown analysis",
    ),
    pytest.param(
        lambda c: engine.train(study(methods=()), c.tmp / "never_claimed"),
        ValueError,
        "config.methods: no methods (and no analyses)",
        id="a study with nothing to do",
    ),
    pytest.param(
        lambda c: engine.train(study(experiment="pruning", methods=()), c.tmp / "never_claimed"),
        ValueError,
        "config.experiment is gone: every study runs on the study engine",
        id="a config of the experiments before the engine",
    ),
    pytest.param(
        lambda c: sharding.make_mesh(data=4096),
        ValueError,
        "needs 4096 devices",
        id="a mesh larger than the machine",
    ),
    pytest.param(
        lambda c: sharding.make_mesh(member=0),
        ValueError,
        "mesh axis sizes must be positive integers",
        id="a mesh axis of size 0",
    ),
    pytest.param(
        lambda c: as_two_processes(lambda: sharding.make_mesh(data=1)),
        ValueError,
        "with several processes the mesh must span all of them",
        id="2 processes, a mesh not spanning every device",
    ),
    pytest.param(
        lambda c: hold_with_lock(c.tmp / "fifo_lock", os.mkfifo),  # refused before any read
        WorkdirError,
        "fifo_lock/.lock is not a regular file: the workdir lock must be one",
        id="a workdir lock that is a FIFO",
    ),
    pytest.param(
        lambda c: hold_with_lock(c.tmp / "dir_lock", os.mkdir),
        WorkdirError,
        "dir_lock/.lock: cannot open the workdir lock (Is a directory)",
        id="a workdir lock that is a directory",
    ),
    pytest.param(
        lambda c: hold_without_locks(c.tmp / "lustre", errno.ENOSYS),
        WorkdirError,
        "lustre has no file locks (flock: Function not implemented)",
        id="a workdir on a file system without flock",
    ),
    pytest.param(
        lambda c: hold_with_lock(c.tmp / "nfs", lambda path: None, mode="nfs"),
        ValueError,
        "workdir_lock: 'nfs'",
        id="an unknown workdir lock mode",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
