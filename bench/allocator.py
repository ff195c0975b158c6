"""glibc malloc with and without transparent huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`).

XLA:CPU allocates its large buffers on every call; glibc serves allocations over 32 MiB with fresh
mmaps, which fault in 4 KiB pages. The tunable is read once at process start, so the two settings
run in two worker processes that take turns (random order per round) on the same programs: one
fine-tuning step (AdamW, dropout on) and one forward, CPU fp32, of MiniLM-L6 (batch 32 x 64
tokens) or, with `--model vit`, of the study ViT of `configs/vit_fmnist.py` (batch 64, as
`bench/train.py` builds it). A turn is `--calls` calls back to back, as in a training or
evaluation loop; the first call of a turn (after the worker sat idle while the other ran) is
reported apart from the rest. Each line gives the median and the mean: a loop's total time is
its mean, which a few slow calls move and the median hides; the back-to-back lines also give the
minor page faults per call (`getrusage`), which count the pages the kernel mapped and zeroed
afresh, and the first line the training step's temporary buffers (XLA's `memory_analysis`),
which XLA:CPU allocates on every call. The Makefile exports the tunable for the study targets.

    .venv/bin/python -m bench.allocator [--repeats 8] [--calls 5] [--model minilm|vit]
        [--also TUNABLES]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import numpy as np

_TUNABLE = "glibc.malloc.hugetlb=1"


def worker(model_name: str) -> None:
    """Answers each `NAME CALLS` line on stdin with the seconds of each of CALLS calls of NAME."""
    import jax

    import hydra_jax as hj
    from hydra_jax import training
    from hydra_jax.data import random_tokens
    from hydra_jax.ensembles import baselines
    from hydra_jax.models import with_classifier

    rng = np.random.default_rng(0)
    if model_name == "vit":
        from bench.train import image_batch, vit_model

        model = vit_model()
        batch = image_batch(model.config, 64)
        inputs = {"pixel_values": batch["pixel_values"]}
    else:
        model = with_classifier(hj.from_pretrained(hj.minilm_l6_path()), 2, jax.random.key(0))
        inputs = random_tokens(rng, 32, 64)
        batch = {**inputs, "labels": rng.integers(0, 2, 32)}
    settings = training.TrainSettings()
    optimizer = training.make_optimizer(settings, 1000)
    step = training.make_train_step(model, optimizer)
    state = training.TrainState.create(model.params, optimizer)
    forward = jax.jit(baselines.single(model))

    def train_step() -> None:
        nonlocal state
        state, _ = step(state, batch, jax.random.key(int(state.step)))
        jax.block_until_ready(state)

    programs = {
        "train step": train_step,
        "forward": lambda: jax.block_until_ready(forward(model.params, inputs)),
    }
    for program in programs.values():  # compile and warm up
        program()
        program()
    temporary = step.single.lower(state, batch, jax.random.key(0)).compile().memory_analysis()
    print("ready", temporary.temp_size_in_bytes, flush=True)
    for line in sys.stdin:
        name, calls = line.rsplit(maxsplit=1)
        seconds, faults = [], 0
        for i in range(int(calls)):
            if i == 1:  # the faults of the calls back to back
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            programs[name]()
            seconds.append(time.perf_counter() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(" ".join(map(str, seconds)), faults, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--also", action="append", default=[], metavar="TUNABLES",
                        help="another GLIBC_TUNABLES setting to compare")  # fmt: skip
    parser.add_argument("--model", choices=("minilm", "vit"), default="minilm")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.model)
        return
    base_env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    settings = {"4 KiB pages (glibc default)": base_env,
                "huge pages (hugetlb=1)": {**base_env, "GLIBC_TUNABLES": _TUNABLE}}  # fmt: skip
    for tunables in args.also:
        settings[tunables] = {**base_env, "GLIBC_TUNABLES": tunables}
    command = [sys.executable, "-m", "bench.allocator", "--worker", "--model", args.model]
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    workers = {name: subprocess.Popen(command, env=env, **pipes) for name, env in settings.items()}
    temporary = 0
    for name, process in workers.items():
        ready, _, size = process.stdout.readline().partition(" ")
        if ready != "ready":
            raise RuntimeError(f"worker {name!r} failed to start")
        temporary = int(size)
    rng = np.random.default_rng(0)
    programs = ("train step", "forward")
    first = {(s, p): [] for s in settings for p in programs}
    rest = {(s, p): [] for s in settings for p in programs}
    faults = {(s, p): 0 for s in settings for p in programs}
    names = list(settings)
    for _ in range(args.repeats):
        for program in programs:
            for i in rng.permutation(len(names)):
                name = names[i]
                workers[name].stdin.write(f"{program} {args.calls}\n")
                workers[name].stdin.flush()
                *seconds, turn_faults = workers[name].stdout.readline().split()
                first[name, program].append(float(seconds[0]))
                rest[name, program] += map(float, seconds[1:])
                faults[name, program] += int(turn_faults)
    for process in workers.values():
        process.stdin.close()
        process.wait()
    shape = "the study ViT, batch 64" if args.model == "vit" else "MiniLM-L6, batch 32 x 64 tokens"
    print(f"{shape}, CPU fp32, {args.repeats} interleaved rounds of {args.calls} calls; "
          "median and mean, ratios to the default's; "
          f"the training step's temporary buffers: {temporary / 2**20:.1f} MiB")  # fmt: skip
    default = names[0]
    for program in programs:
        for label, times in (("back to back", rest), ("first after idle", first)):
            a = times[default, program]
            for name in names:
                b = times[name, program]
                median, mean = np.median(b), np.mean(b)
                paged = (f", {faults[name, program] / len(b):,.0f} page faults per call"
                         if times is rest else "")  # fmt: skip
                print(f"{program:<11}{label:<17} {name:<40} median {median * 1e3:7.1f} ms "
                      f"({median / np.median(a):.3f}), mean {mean * 1e3:7.1f} ms "
                      f"({mean / np.mean(a):.3f}), max {np.max(b) * 1e3:7.1f} ms"
                      + paged)  # fmt: skip


if __name__ == "__main__":
    main()
