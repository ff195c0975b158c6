"""A run's directory: who owns it, who may write in it, what it holds, how long each stage took.

A workdir belongs to the config that first wrote `config.json` into it: a later `train.py` or
`evaluate.py` whose resolved config differs in anything that changes a result is refused, with
the differing keys named, and `config.json` is never rewritten. While a stage runs, the workdir
is locked: a second `train.py` or `evaluate.py` on it is refused, naming the process holding it.
With several processes, process 0 alone writes (`write_json`, `write_text`); every process
reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_collections
from flax import traverse_util

from hydra_jax import checks
from hydra_jax.checks import split_names
from hydra_jax.data.text import MIN_TOKENS
from hydra_jax.evaluation import save_predictions
from hydra_jax.experiments import migrations, single_pass
from hydra_jax.models.sharding import barrier, is_primary

# Keys that change no result beyond float32 rounding: how a run is labelled, where
# preprocessed images are kept, the device mesh it is laid out on (which splits sums) and how
# many training steps one compiled call runs (another program), and how the workdir is held.
COSMETIC_KEYS = frozenset(
    {
        "title",
        "mesh.data",
        "mesh.member",
        "mesh.heads",
        "data.cache",
        "train.steps_per_call",
        "workdir_lock",
    }
)
# The workdir's layout: every folder and file a study writes, by what it holds (`layout`).
LAYOUT = {
    "member": "hf/member_{m}",  # member m's published classifier (an HF directory)
    "member_training": "members/member_{m}",  # its checkpoints and training logs
    "dual_encoder": "hf/dual_encoder",  # a dual encoder trained here (zero-shot)
    "zero_shot": "zero_shot",  # the zero-shot classifier (our format)
    "hydra": "fused/{strategy}",  # the fused Hydra of a strategy
    "pruned": "pruned/{strategy}",  # its member 0 alone
    "hydra_member_training": "hydra_members/{strategy}",  # its members' fine-tuning
    "fused_training": "fused_training/{strategy}",  # the fused network's fine-tuning
    "efficient": "efficient/{kind}",  # a single-pass ensemble
    "efficient_training": "efficient_training/{kind}",
    "ablation_training": "members/{name}",  # an ablation Hydra's members' fine-tuning
    "ablation_member": "saved/{name}/member_{m}",  # and each member saved
    "predictions": "predictions/{method}.npz",  # a method's saved predictions
    "plots": "plots",
}
LOCK_FILE = ".lock"
LOCKS = ("flock", "none")  # `config.workdir_lock`: how a run holds its workdir (`Workdir.hold`)
# flock's errors on a file system that does not carry locks (NFS with `nolock`, Lustre without
# `-o flock`).
NO_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})
CONFIG_FILE = "config.json"
TIMINGS_FILE = "train_timings.json"  # the train stage's wall time per stage
RESULTS_FILE, REPORT_FILE = "results.json", "report.md"

# Config keys that are counts, with their least value (a study has the keys it uses). They are
# checked before a workdir is claimed: a bad value recorded there would make the corrected
# config conflict with the workdir.
COUNTS = {
    **dict.fromkeys(
        [
            "eval.batch_size",
            "eval.num_bins",
            "eval.latency_batch",
            "eval.latency_tokens",
            "eval.latency_repeats",
            "ensemble_size",
            "mc_dropout_samples",
            "num_members",
            "calibration_size",
            "eval.knn_k",
        ],
        1,
    ),
    **dict.fromkeys(
        [
            "data.train_limit",
            "data.eval_limit",
            "data.ood_limit",
            "data.shift_limit",
            "eval.raps_k",
            "eval.vim_dim",
            "eval.feature_fit_limit",
            "eval.calibration_limit",
        ],
        0,
    ),  # 0: the whole split
    "data.max_tokens": MIN_TOKENS,  # [CLS], a token, [SEP]
}


class WorkdirError(ValueError):
    """A workdir that belongs to another config, that a stage needs and lacks, or that another
    run is using."""


def flat(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    """`{"a.b": value}` of a (nested) config, tuples as lists (as JSON writes them)."""
    tree = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
    items = traverse_util.flatten_dict(tree, sep=".").items()
    return {k: json.loads(json.dumps(v)) for k, v in items}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """`path` held with an exclusive `flock` (`Workdir.hold`), naming its holder in it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise WorkdirError(
                f"{path} is a symbolic link: the workdir lock is never a link (remove it)"
            ) from None
        raise WorkdirError(f"{path}: cannot open the workdir lock ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WorkdirError(f"{path} is not a regular file: the workdir lock must be one")
    with os.fdopen(fd, "r+") as file:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = file.read().strip() or "another process"
            raise WorkdirError(
                f"{path.parent} is in use by {holder}: wait for that run to end, or use "
                "another --workdir"
            ) from None
        except OSError as error:
            if error.errno not in NO_LOCKS:
                raise
            raise WorkdirError(
                f"the file system of {path.parent} has no file locks (flock: "
                f"{error.strerror}), so two runs on this workdir could not be kept apart: put "
                "the workdir on a local disk or a file system with locks, or run without the "
                "lock (--config.workdir_lock=none) and keep other runs off it yourself"
            ) from None
        try:
            file.truncate()
            file.write(f"process {os.getpid()} on {socket.gethostname()} ({' '.join(sys.argv)})\n")
            file.flush()
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def layout(root: Path | str, what: str, **names: Any) -> Path:
    """Where a workdir `root` holds `what` (a key of `LAYOUT`), its names filled in."""
    return Path(root) / LAYOUT[what].format(**names)


def config_differences(config: ml_collections.ConfigDict, recorded: dict) -> list[str]:
    """Keys whose values differ between `config` and a recorded `config.json` (cosmetic ones
    excepted), each as `key: recorded -> now`."""
    now = flat(config)
    before = migrations.upgrade(flat(recorded), now)  # an older run's config read as today's
    recorded_methods = split_names(before.get("methods", []))
    # A single-pass ensemble's settings are under its name (`mimo.`): a recorded run whose methods
    # do not name one trained none, so its settings now reproduce it.
    inert = tuple(f"{name}." for name in single_pass.METHODS if name not in recorded_methods)
    if inert:
        before = {k: v for k, v in now.items() if k.startswith(inert)} | before
    keys = sorted((set(now) | set(before)) - COSMETIC_KEYS)
    missing = object()
    return [
        f"{k}: {before.get(k, missing)!r} -> {now.get(k, missing)!r}".replace(
            repr(missing), "(absent)"
        )
        for k in keys
        if now.get(k, missing) != before.get(k, missing)
    ]


def check_counts(config: ml_collections.ConfigDict) -> None:
    """Refuses a count of `COUNTS` below its least value, or not an integer, by its key."""
    for key, value in flat(config).items():
        if key in COUNTS:
            checks.count(key, value, minimum=COUNTS[key])


class Workdir:
    """One run's directory (`path`) and the wall time of the stages run in it (`stages`)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.stages: dict[str, float] = {}

    @classmethod
    def of(cls, workdir: Workdir | Path | str) -> Workdir:
        """`workdir` as a `Workdir` (a path is wrapped; a `Workdir` is returned as it is)."""
        return workdir if isinstance(workdir, Workdir) else cls(workdir)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def at(self, what: str, **names: Any) -> Path:
        """Where this workdir holds `what` (`LAYOUT`), e.g. `at("hydra", strategy="taylor")`."""
        return layout(self.path, what, **names)

    def __str__(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def hold(self, create: bool = True, lock: str = "flock") -> Iterator[None]:
        """Holds the workdir exclusively while a stage runs: a second `train.py` or
        `evaluate.py` on it is refused, naming the process that holds it, and touches nothing of
        the first run.

        The lock (`lock="flock"`) is the operating system's `flock` on `.lock`: it is released
        when the holder exits, killed or not, so a stale lock file never blocks a restart. It
        holds between processes of one host, and between hosts only where the file system
        carries `flock` across them (NFS with working locks, Lustre mounted with `-o flock`).
        A file system without locks is refused, naming it, unless the run asks for none
        (`lock="none"`: the user keeps other runs off the workdir). `.lock` is opened without
        following a symbolic link and must be a regular file. Only process 0 takes it (the
        processes of one run share the workdir). With `create=False`, a missing workdir is left
        missing (the stage reports it); a workdir this call created and the stage left empty (a
        config refused before it was claimed) is removed again.

        Raises:
          WorkdirError: the workdir is held, `.lock` is a link or not a file, or its file system
            has no locks.
          ValueError: `lock` is neither "flock" nor "none".
        """
        if lock not in LOCKS:
            raise ValueError(f"workdir_lock: {lock!r}; one of {', '.join(LOCKS)}")
        if not is_primary() or not (create or self.path.is_dir()):
            yield
            return
        created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        held = _locked(self.path / LOCK_FILE) if lock == "flock" else contextlib.nullcontext()
        try:
            with held:
                yield
        finally:  # once released: the holder of a lock never deletes its file
            if created and {p.name for p in self.path.iterdir()} <= {LOCK_FILE}:
                with contextlib.suppress(OSError):  # another run came in: it keeps the file
                    (self.path / LOCK_FILE).unlink(missing_ok=True)
                    self.path.rmdir()

    def claim(self, config: ml_collections.ConfigDict) -> None:
        """Makes the workdir `config`'s: writes `config.json` in a new one; in an existing one,
        refuses a config that differs in anything but cosmetic keys (and never rewrites it).

        Raises:
          ValueError: a count of `COUNTS` that is out of range (before anything is written).
          WorkdirError: naming every differing key.
        """
        check_counts(config)
        new = not (self.path / CONFIG_FILE).is_file()
        barrier("looked for config.json")  # several processes: all look before process 0 writes
        if new:
            if is_primary():
                self.path.mkdir(parents=True, exist_ok=True)
            record = json.loads(config.to_json_best_effort())
            record[migrations.SCHEMA_KEY] = migrations.SCHEMA
            self.write_json(CONFIG_FILE, record)
            barrier("wrote config.json")
            return
        self.check(config)

    def check(self, config: ml_collections.ConfigDict) -> dict:
        """The recorded config of an existing run of `config` here; creates nothing.

        Raises:
          WorkdirError: no run here, or one made with a config that differs (keys named).
        """
        if not (self.path / CONFIG_FILE).is_file():
            raise WorkdirError(
                f"{self.path} holds no run of this experiment (no config.json): run train.py "
                "with this --config and --workdir first"
            )
        recorded = self.read_json(CONFIG_FILE)
        try:
            differences = config_differences(config, recorded)
        except ValueError as error:  # a schema this code cannot read
            raise WorkdirError(f"{self.path / CONFIG_FILE}: {error}") from None
        if differences:
            raise WorkdirError(
                f"{self.path} belongs to a run with another config; these keys differ "
                f"(recorded -> given): {'; '.join(differences)}. Use a new --workdir for a new "
                "configuration, or give the recorded values"
            )
        return recorded

    def recorded(self) -> ml_collections.ConfigDict:
        """The resolved config a `train.py` run wrote here (e.g. a base model's)."""
        if not (self.path / CONFIG_FILE).is_file():
            raise WorkdirError(
                f"{self.path / CONFIG_FILE} not found: train the base model in {self.path} first"
            )
        recorded = self.read_json(CONFIG_FILE)
        if recorded.get(migrations.SCHEMA_KEY) == migrations.SCHEMA:
            del recorded[migrations.SCHEMA_KEY]
            return ml_collections.ConfigDict(recorded)
        upgraded = migrations.upgrade(flat(recorded))  # an older run's config read as today's
        return ml_collections.ConfigDict(traverse_util.unflatten_dict(upgraded, sep="."))

    def require(self, path: Path, what: str) -> Path:
        """`path` (inside the workdir), refused with a named stage to run if it is missing."""
        if not Path(path).exists():
            raise WorkdirError(
                f"{path} holds no {what}: run train.py with this --config and --workdir "
                f"{self.path} to the end first"
            )
        return Path(path)

    @contextlib.contextmanager
    def stage(self, name: str, record: bool = True) -> Iterator[None]:
        """Times the block as stage `name` (with `record=False`, it is not recorded: e.g. a
        restored member keeps the time of the run that trained it)."""
        start = time.perf_counter()
        yield
        if record:
            self.stages[name] = time.perf_counter() - start

    def save_stages(self) -> None:
        """Adds this run's train-stage timings to those of earlier (resumed) runs."""
        stages = {**self.read_json(TIMINGS_FILE, {}), **self.stages}
        self.write_json(TIMINGS_FILE, stages, sort_keys=False)

    def train_stages(self) -> dict[str, float]:
        """The train stage's timings, then those of this (evaluate) run so far."""
        return {**self.read_json(TIMINGS_FILE, {}), **self.stages}

    def read_json(self, name: str, default: Any = None) -> Any:
        path = self.path / name
        if default is not None and not path.is_file():
            return default
        return json.loads(path.read_text())

    def write_json(self, name: str, value: Any, sort_keys: bool = True) -> None:
        """Writes `name` (process 0 only)."""
        self.write_text(name, json.dumps(value, indent=2, sort_keys=sort_keys))

    def write_results(
        self, results: dict[str, Any], report: str, config: ml_collections.ConfigDict
    ) -> None:
        """`results.json` (with the `config` it was evaluated with) and `report.md`: every
        study writes its results here, once, at the end of its evaluate stage."""
        results["config"] = json.loads(config.to_json_best_effort())
        self.write_json(RESULTS_FILE, results)
        self.write_text(REPORT_FILE, report)

    def write_arrays(self, path: Path, arrays: dict[str, Any]) -> None:
        """Writes `arrays` to the `.npz` file `path` in the workdir (process 0 only)."""
        if is_primary():
            save_predictions(path, arrays)

    def write_plots(self, draw: Callable[[Path], None]) -> None:
        """Lets `draw(directory)` write its plots into the workdir's `plots/` (process 0
        only)."""
        if is_primary():
            directory = self.at("plots")
            directory.mkdir(parents=True, exist_ok=True)
            draw(directory)

    def write_text(self, name: str, text: str) -> None:
        """Writes `name` (process 0 only), creating its folder."""
        if is_primary():
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_text(text)
