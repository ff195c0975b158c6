"""Native CPU kernels: C++ compiled on first use for the machine that runs it, as XLA FFI targets.

XLA:CPU runs some small programs far below the machine's speed (the attention of narrow heads:
`bench/native.py`). Where a kernel here is faster, the models call it through `jax.ffi` on the
CPU backend and fall back to XLA's own code everywhere else. The sources ship with the package
and are compiled once per machine by the system's C++ compiler (`$CXX`, else `c++`) with
`-march=native`, into `$HYDRA_JAX_CACHE/native` (default `~/.cache/hydra_jax/native`); the file
name hashes the source, the compiler, its flags, jaxlib's version and the CPU, so a cache shared
by machines of different kinds keeps one build per kind. Without a compiler, or when the build
fails, a warning says so and XLA's code runs: the same results within float32 rounding.
`HYDRA_JAX_NATIVE=0` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jaxlib

SOURCES = Path(__file__).parent
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC")
SWITCH = "HYDRA_JAX_NATIVE"
# FFI target names -> the symbols of their handlers, per source file.
TARGETS = {
    "attention": {
        "hydra_jax_attention_forward": "AttentionForward",
        "hydra_jax_attention_backward": "AttentionBackward",
    }
}


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def cache_dir() -> Path:
    root = os.environ.get("HYDRA_JAX_CACHE", Path.home() / ".cache" / "hydra_jax")
    return Path(root) / "native"


def cpu_identity() -> str:
    """The CPU's model and instruction-set flags (Linux), else what `platform` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted)) or f"{platform.machine()} {platform.processor()}"


def library_path(name: str, compiler: str) -> Path:
    """Where the build of `SOURCES/name.cc` by `compiler` for this machine is cached.

    Raises:
      OSError: the compiler cannot be run.
      subprocess.CalledProcessError: it cannot tell its version.
    """
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True
    ).stdout
    parts = (
        (SOURCES / f"{name}.cc").read_text(), version, " ".join(FLAGS), jaxlib.__version__,
        cpu_identity(),
    )  # fmt: skip
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return cache_dir() / f"{name}-{key}.so"


def build(name: str, compiler: str) -> Path:
    """The shared library of `SOURCES/name.cc` for this machine, compiled unless cached.

    Raises:
      OSError: the compiler cannot be run.
      subprocess.CalledProcessError: the compiler refused the source (`stderr` says why).
    """
    target = library_path(name, compiler)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Another process may build the same file at once: each writes its own, one rename wins.
    with tempfile.TemporaryDirectory(dir=target.parent) as directory:
        built = Path(directory) / target.name
        source = SOURCES / f"{name}.cc"
        command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(source), "-o", str(built)]
        subprocess.run(command, capture_output=True, text=True, check=True)
        os.replace(built, target)
    return target


@functools.cache
def load(name: str) -> bool:
    """Whether the kernels of `SOURCES/name.cc` are built, loaded and registered with XLA:CPU
    (once per process; a warning where they cannot be)."""
    if not enabled():
        return False
    compiler = os.environ.get("CXX", "c++")
    try:
        library = ctypes.cdll.LoadLibrary(str(build(name, compiler)))
    except subprocess.CalledProcessError as error:
        warnings.warn(
            f"hydra_jax: {compiler} could not compile the native {name} kernel, so XLA's code "
            f"runs in its place:\n{error.stderr}",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    except OSError as error:
        warnings.warn(
            f"hydra_jax: no native {name} kernel ({compiler}: {error}), so XLA's code runs in "
            f"its place; install a C++ compiler or set {SWITCH}=0 to silence this",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    for target, symbol in TARGETS[name].items():
        handler = jax.ffi.pycapsule(getattr(library, symbol))
        jax.ffi.register_ffi_target(target, handler, platform="cpu")
    return True
