"""Steps per call: the training step's time per step, and the page faults per step, when one
compiled call runs K steps (`TrainStep.steps`, what `fit` runs; `TrainSettings.steps_per_call`).

XLA:CPU allocates a program's temporary buffers as one block on every call, and glibc maps a
block that large afresh each time, so every page of it faults on first touch in every call
(`bench.allocator`). A call of K steps allocates the block once for K steps. The programs (K in
`--steps`, all on the same batch, the state carried) take turns in one process, a round being
one call of each in a random order (bench/timing.py); each line gives the median time per step
over the rounds, its ratio to K = 1's, and the minor page faults per step (`getrusage`).

    .venv/bin/python -m bench.calls [--model vit|minilm] [--steps 1,2,4,8,16] [--rounds 6]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import jax
import numpy as np

import hydra_jax as hj
from bench.train import image_batch, our_steps, text_batch, vit_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=("vit", "minilm"), default="vit")
    parser.add_argument("--steps", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    try:
        counts = [int(k) for k in args.steps.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.rounds < 1:
        parser.error(
            f"--steps takes positive step counts (got {args.steps!r}), --rounds a positive "
            f"count (got {args.rounds})"
        )
    if args.model == "vit":
        model = vit_model()
        batch, what = image_batch(model.config, 64), "study ViT, batch 64"
    else:
        model = hj.with_classifier(hj.from_pretrained(hj.minilm_l6_path()), 2, jax.random.key(1))
        batch, what = text_batch(32, 64), "MiniLM-L6, batch 32 x 64"
    calls = {k: our_steps(model, batch, k) for k in counts}
    for call in calls.values():  # compile and warm up
        call()
        call()
    seconds: dict[int, list[float]] = {k: [] for k in counts}
    faults = dict.fromkeys(counts, 0)
    rng = np.random.default_rng(0)
    for _ in range(args.rounds):
        for k in rng.permutation(counts):
            k = int(k)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            calls[k]()
            seconds[k].append((time.perf_counter() - start) / k)
            faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    base = statistics.median(seconds[counts[0]])
    print(f"{what}, CPU fp32 training step, {args.rounds} interleaved rounds; per step:")
    for k in counts:
        median, per_step = statistics.median(seconds[k]), faults[k] / (k * args.rounds)
        print(f"  {k:>3} steps per call: {median * 1e3:8.1f} ms ({median / base:.3f} of "
              f"{counts[0]} per call), {per_step:>9,.0f} page faults")  # fmt: skip


if __name__ == "__main__":
    main()
