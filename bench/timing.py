"""Interleaved timing: compared programs take turns in one process, so machine noise hits all.

On a small CPU machine a program's time depends on what ran just before it (a long, hot
program leaves caches, allocator and clock in another state), so each round runs the programs
in a fresh random order: every program sees the same mix of predecessors.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def interleaved(
    programs: dict[str, Callable[[], Any]], repeats: int = 20, warmup: int = 2, seed: int = 0
) -> dict[str, list[float]]:
    """Runs every program `warmup` times, then `repeats` rounds of one call each, in turn.

    The order within a round is a random permutation (seeded by `seed`). Each program must
    block until its result is ready (e.g. `jax.block_until_ready`). Returns seconds per call,
    per program.
    """
    for program in programs.values():
        for _ in range(warmup):
            program()
    names = list(programs)
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for i in rng.permutation(len(names)):
            start = time.perf_counter()
            programs[names[i]]()
            times[names[i]].append(time.perf_counter() - start)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(t) for name, t in times.items()}
