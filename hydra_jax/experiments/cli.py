"""The command line of the studies: `train.py`, `evaluate.py` and the `hydra-jax` command share
the flags, the override checks and one clean error line."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from hydra_jax.experiments import engine
from hydra_jax.experiments.workdir import WorkdirError, flat

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiment config file (configs/NAME.py[:VARIANT])", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "the run's directory")
flags.mark_flags_as_required(["config", "workdir"])
# Several processes (docs/scale.md): JAX's own runtime. With --coordinator_address (or the
# JAX_COORDINATOR_ADDRESS environment variable, or --distributed on a cluster JAX detects:
# Cloud TPU, SLURM, Open MPI), each process calls jax.distributed.initialize before anything
# else; --config.mesh then spans the devices of every process.
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0's coordinator (several processes)"
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "how many processes the run has")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "this process's index, 0 .. n - 1")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "initialise jax.distributed from the cluster's environment"
)
_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout", 300, "seconds to wait for every process to join, and to shut down"
)


def distributed() -> dict[str, Any] | None:
    """`jax.distributed.initialize`'s arguments when the flags or the environment ask for several
    processes, else None."""
    address = _COORDINATOR.value or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not (address or _DISTRIBUTED.value):
        return None
    timeout = _TIMEOUT.value
    return dict(
        coordinator_address=address,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        initialization_timeout=timeout,
        shutdown_timeout_seconds=timeout,
    )


def _config_argument(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def check_overrides(argv: Sequence[str]) -> None:
    """Refuses `--config.KEY=V` for a KEY the config lacks, naming the valid keys.

    absl would raise deep inside flag parsing with a traceback; this runs first.
    """
    spec = _config_argument(argv)
    overrides = [a[len("--config.") :].split("=", 1)[0] for a in argv if a.startswith("--config.")]
    if spec is None or not overrides:
        return
    path, _, variant = spec.partition(":")
    if not Path(path).is_file():
        raise app.UsageError(f"config file {path} not found")
    module_spec = importlib.util.spec_from_file_location("_checked_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(variant) if variant else module.get_config()
    valid = sorted(flat(config))
    for key in overrides:
        if key not in valid:
            raise app.UsageError(f"unknown config key {key}; valid keys: {', '.join(valid)}")


def run(stage_index: int) -> Callable[[list[str]], None]:
    """The absl `main` of the study engine's stage 0 (train) or 1 (evaluate) on `--config`."""

    def main(argv: list[str]) -> None:
        del argv
        logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
        config: ml_collections.ConfigDict = _CONFIG.value
        try:
            engine.run(STAGES[stage_index], config, _WORKDIR.value, distributed())
        except (WorkdirError, FileNotFoundError, ValueError, FloatingPointError) as error:
            # A named, expected problem: one line, no traceback (HYDRA_JAX_DEBUG=1 shows it).
            if os.environ.get("HYDRA_JAX_DEBUG"):
                raise
            print(f"error: {error} (HYDRA_JAX_DEBUG=1 shows the traceback)", file=sys.stderr)
            _exit(2)
        except BaseException:
            if jax.process_count() == 1:
                raise
            traceback.print_exc()
            _exit(1)
        if jax.process_count() > 1:
            jax.distributed.shutdown()

    return main


def _exit(code: int) -> None:
    """Exits; with several processes at once, since the shutdown barrier would wait for the
    others (up to --distributed_timeout) and hide this process's error."""
    if jax.process_count() == 1:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


STAGES = ("train", "evaluate")
# Study configs that ship with the package, by the name `--config` takes (a path works too).
PACKAGED_CONFIGS = {"custom": Path(__file__).with_name("custom.py")}
USAGE = """usage: hydra-jax {train,evaluate} --config CONFIG[:VARIANT] --workdir DIR [--config.K=V]
       hydra-jax plan --config FILE[:ARG] --target cpu:N|TOPOLOGY [--mesh A=N,...] [--json F]
       hydra-jax compare WORKDIR... --a METHOD --b METHOD [--csv F] [--latex F]
       hydra-jax plot WORKDIR

  hydra-jax train    --config custom --workdir runs/mine --config.model=CHECKPOINT_DIR \\
      --config.data.train=csv:train.csv --config.data.test=csv:test.csv
  hydra-jax evaluate --config custom --workdir runs/mine   (the same fields)

CONFIG is `custom` (the generic study on your checkpoint and files; `custom:smoke` cuts every
budget) or the path of a config file. `hydra-jax train --helpfull` lists the flags. `plan`
compiles a config's programs for a target without running them (configs/paper/). `compare`
gives every metric of two methods over evaluated workdirs (one per training seed): mean +- std
and paired bootstrap intervals, as CSV and LaTeX. `plot` draws an evaluated workdir's plots
again from its predictions and results."""


def packaged_config(argv: Sequence[str]) -> list[str]:
    """`argv` with a packaged config's name (`--config custom:smoke`) replaced by its file path."""

    def resolve(spec: str) -> str:
        name, colon, variant = spec.partition(":")
        return f"{PACKAGED_CONFIGS[name]}{colon}{variant}" if name in PACKAGED_CONFIGS else spec

    out = list(argv)
    for i, arg in enumerate(out):
        if arg.startswith("--config="):
            out[i] = "--config=" + resolve(arg.split("=", 1)[1])
        elif arg == "--config" and i + 1 < len(out):
            out[i + 1] = resolve(out[i + 1])
    return out


def main(argv: Sequence[str] | None = None) -> Any:
    """The `hydra-jax` console command: `hydra-jax train|evaluate --config ... --workdir ...`,
    `hydra-jax plan --config ... --target ...` (`hydra_jax.experiments.aot`), `hydra-jax
    compare WORKDIR... --a A --b B` (`hydra_jax.experiments.compare`) or `hydra-jax plot
    WORKDIR` (`hydra_jax.experiments.evaluators.plots`)."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) > 1 and argv[1] == "plan":
        from hydra_jax.experiments import aot

        sys.exit(aot.main(argv[2:]))
    if len(argv) > 1 and argv[1] == "compare":
        from hydra_jax.experiments import compare

        sys.exit(compare.main(argv[2:]))
    if len(argv) > 1 and argv[1] == "plot":
        from hydra_jax.experiments.evaluators import plots

        sys.exit(plots.main(argv[2:]))
    if len(argv) < 2 or argv[1] not in STAGES:
        asked = len(argv) > 1 and argv[1] in ("-h", "--help", "help")
        print(USAGE, file=sys.stdout if asked else sys.stderr)
        sys.exit(0 if asked else 2)
    stage = STAGES.index(argv[1])
    return start(stage, [f"{Path(argv[0]).name} {argv[1]}", *packaged_config(argv[2:])])


def start(stage_index: int, argv: Sequence[str] | None = None) -> Any:
    argv = list(sys.argv if argv is None else argv)
    try:
        check_overrides(argv)
    except app.UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    return app.run(run(stage_index), argv=argv)
