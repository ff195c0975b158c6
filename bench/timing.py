"""Interleaved timing: compared programs take turns in one process, so machine noise hits all."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved(
    programs: dict[str, Callable[[], Any]], repeats: int = 20, warmup: int = 2
) -> dict[str, list[float]]:
    """Runs every program `warmup` times, then `repeats` rounds of one call each, in turn.

    Each program must block until its result is ready (e.g. `jax.block_until_ready`).
    Returns seconds per call, per program.
    """
    for program in programs.values():
        for _ in range(warmup):
            program()
    times: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(repeats):
        for name, program in programs.items():
            start = time.perf_counter()
            program()
            times[name].append(time.perf_counter() - start)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(t) for name, t in times.items()}
