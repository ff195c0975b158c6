"""Timing in separate processes taken in turns: how a JAX program is compared with PyTorch.

PyTorch's OpenMP threads keep spinning for a while after each op; in the same process the XLA
program that runs next competes with them for the cores and looks slower than it is (the
MiniLM forward read 1.02-1.04x PyTorch's interleaved in one process and 0.87x in separate
processes on a Zen 3 EPYC; docs/benchmarks.md). So each side runs in a process of its own:
a worker builds its program, warms it up, times `repeats` calls and prints the times as one
JSON line. The sides alternate (A B, then B A, ...) for `rounds`, so a slow drift of the
machine hits both.

A benchmark module using this has a `worker(side, args) -> dict` entry (run with `--worker
SIDE`) that returns `{"times": [...], ...}`; `alternating` collects them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def time_calls(call: Callable[[], Any], repeats: int, warmup: int = 2) -> list[float]:
    """Seconds per call of `call` (which must block until its result is ready)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def alternating(
    module: str, sides: Sequence[str], args: Sequence[str], rounds: int
) -> dict[str, list[dict[str, Any]]]:
    """Each side's worker results, one per round; sides take turns, reversing every round."""
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for r in range(rounds):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            done = subprocess.run(
                [sys.executable, "-m", module, "--worker", side, *args],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode:
                raise RuntimeError(f"{module} --worker {side} failed:\n{done.stderr[-3000:]}")
            results[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def median_of(results: list[dict[str, Any]], key: str = "times") -> float:
    """The median over every timed call of every round (of the workers' `key` lists)."""
    return statistics.median(t for r in results for t in r[key])


def print_worker(result: dict[str, Any]) -> None:
    """A worker's one JSON line (its last line of output)."""
    print(json.dumps(result))
