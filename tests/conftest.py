"""Test-wide numerics: exact fp32 matmuls, no silent rank or dtype promotion (a swapped axis or
a stray float64 fails instead of broadcasting or upcasting)."""

from __future__ import annotations

import collections
import importlib.util
import os
import subprocess

# Compilation dominates this suite's time (tiny models, hundreds of programs), and the programs'
# speed does not matter here: LLVM at -O0 compiles faster, and at -O0 so does XLA:CPU's older
# fusion code generator (fusion emitters off; at the default -O2 it is the other way round, so
# the studies keep XLA's defaults). XLA splits each module for parallel code generation, but the
# two workers already keep both cores busy: one part compiles faster. Set before JAX starts its
# backend; subprocesses (the CLI tests) inherit it.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    + " --xla_cpu_parallel_codegen_split_count=1"
).strip()

# The suite runs on CPU devices (8 of them, below). Without this, a JAX that finds libtpu (the
# `tpu` extra, which `hydra-jax plan` compiles TPU programs with) tries a TPU at start-up in every
# process and holds libtpu's lock file, which the plan tests then cannot take.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # after the environment above: JAX reads it on import
import pytest

# 8 CPU devices for the mesh tests (tests/test_sharding.py); set before the backend starts.
# Everything else runs on device 0, as on a one-device machine.
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

HAS_TORCH = importlib.util.find_spec("torch") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `make test` runs files in collection order on two workers (`--no-loadscope-reorder`): the
    # files with the most slow tests start first, so they end before the short files do and
    # neither worker waits alone at the end. Only the order changes.
    slow = collections.Counter(item.path for item in items if "slow" in item.keywords)
    items.sort(key=lambda item: -slow[item.path])  # stable
    if HAS_TORCH:
        return
    skip = pytest.mark.skip(reason="torch is not installed: PyTorch parity checks skipped")
    for item in items:
        if "torch" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _processes_are_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a process is marked `processes`: `make test-processes` runs those,
    `make test` the others, which start none (it stays within minutes)."""
    if "processes" in request.keywords:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a process ({args[1] if len(args) > 1 else kwargs}): "
            "mark it @pytest.mark.processes"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory: pytest.TempPathFactory):
    """A data dir whose source archive is synthetic (see tests/synthetic.py); prepared lazily."""
    from synthetic import write_source

    data_dir = tmp_path_factory.mktemp("data")
    write_source(data_dir / "downloads")
    return data_dir


@pytest.fixture(scope="session")
def synthetic_image_dir(tmp_path_factory: pytest.TempPathFactory):
    """A data dir with synthetic image sources (see tests/synthetic_images.py)."""
    from synthetic_images import write_image_sources

    data_dir = tmp_path_factory.mktemp("image_data")
    write_image_sources(data_dir / "downloads")
    return data_dir
