"""Training speed: our fine-tuning step against `transformers` + PyTorch AdamW, a fused Hydra's
step against the single model's, and `fit`'s wall time per step against the bare compiled step.
Our step is timed two ways: one step per call, and `--steps-per-call` steps in one call
(`TrainStep.steps`, as `fit` runs them; its default is `TrainSettings`'), per step.

CPU, fp32, or `--dtype bfloat16` for the steps against PyTorch (ours: `hj.with_dtype`, bf16
dense products; `bfloat16:bfloat16`, bf16 hidden states too; PyTorch: the forward under
`torch.autocast("cpu", torch.bfloat16)`). Ours vs PyTorch run in
separate processes taken in turns (bench/processes.py), since PyTorch's spinning OpenMP threads
slow an XLA program in the same process; the JAX-only comparisons run interleaved in one process
(bench/timing.py). Shapes:

- MiniLM-L6 (the real checkpoint) + a 2-way classifier, batch 32 x 64 tokens, dropout on,
  AdamW with global-norm clipping (the text studies' step);
- the study ViT of `configs/vit_fmnist.py` (random weights; 28 x 28 grey images), batch 64;
- the fused MiniLM Hydra of 3 members x 4 heads per layer against the single MiniLM's step.

    .venv/bin/python -m bench.train [--rounds 4] [--repeats 5] [--fit-steps 20]
        [--only text,vit,jax] [--batch 32] [--tokens 64]
        [--dtype float32|bfloat16|bfloat16:bfloat16] [--steps-per-call 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import hydra_jax as hj
from bench.precision import PRECISIONS, at_precision
from bench.processes import alternating, median_of, print_worker, time_calls
from bench.timing import interleaved, medians
from configs import vit_fmnist
from hydra_jax.data import TokenizedSet
from hydra_jax.experiments import artefacts
from hydra_jax.training import (
    TrainSettings,
    TrainState,
    fit,
    make_optimizer,
    make_train_step,
    schedule_length,
)

SETTINGS = TrainSettings(epochs=1.0, batch_size=32, learning_rate=5e-5)
STEPS = 1000  # the schedule's length (its value does not change a step's cost)


def our_steps(model: hj.Model, batch: dict[str, np.ndarray], every: int):
    """A blocking call of `every` training steps of `model` in one compiled call
    (`TrainStep.steps`, as `fit` runs them), on copies of `batch`, the state carried."""
    step, start = step_and_state(model)
    state = [start]
    batches = {k: np.stack([v] * every) for k, v in batch.items()}
    keys = jax.random.split(jax.random.key(0), every)

    def call() -> None:
        state[0], metrics = step.steps(state[0], batches, keys, np.int32(every))
        jax.block_until_ready(metrics["loss"])

    return call


def per_step_times(model: hj.Model, batch: dict[str, np.ndarray], every: int, repeats: int):
    """Seconds per step of `our_steps` calls of `every` steps (at least 3 calls, `repeats`
    steps in all)."""
    calls = time_calls(our_steps(model, batch, every), max(3, -(-repeats // every)))
    return [t / every for t in calls]


def text_batch(batch: int, tokens: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(1000, 30000, (batch, tokens)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids), "labels": np.arange(batch) % 2}  # fmt: skip


def image_batch(config: Any, batch: int) -> dict[str, np.ndarray]:
    shape = (batch, config.num_channels, config.image_size, config.image_size)
    pixels = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return {"pixel_values": pixels, "labels": np.arange(batch) % config.num_labels}


def vit_model() -> hj.Model:
    config = vit_fmnist.get_config()
    return hj.Model.init(artefacts.scratch_config(config), jax.random.key(0))


def step_and_state(model: hj.Model) -> tuple[Any, TrainState]:
    """The studies' jitted training step of `model` (AdamW, clipping, dropout) and its start."""
    optimizer = make_optimizer(SETTINGS, STEPS)
    return make_train_step(model, optimizer), TrainState.create(model.params, optimizer)


def our_step(
    model: hj.Model, batch: dict[str, np.ndarray], made: tuple[Any, TrainState] | None = None
):
    """One training step of `model` as a blocking call (the state carried across calls), of
    `made = step_and_state(model)` where the caller needs the step too."""
    step, start = made or step_and_state(model)
    state = [start]
    key = jax.random.key(0)

    def call() -> None:
        state[0], metrics = step(state[0], batch, key)
        jax.block_until_ready(metrics["loss"])

    return call


def torch_step(path: Path, kind: str, batch: dict[str, np.ndarray], dtype: str = "float32"):
    import torch
    import transformers

    classes = {"text": transformers.BertForSequenceClassification,
               "vit": transformers.ViTForImageClassification}  # fmt: skip
    extra = {"num_labels": 2} if kind == "text" else {}  # the ViT's classifier is in its config
    model = classes[kind].from_pretrained(path, **extra)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=SETTINGS.learning_rate,
                                  weight_decay=SETTINGS.weight_decay)  # fmt: skip
    inputs = {k: torch.tensor(v, dtype=torch.long if v.dtype.kind == "i" else torch.float32)
              for k, v in batch.items()}  # fmt: skip

    low = dtype != "float32"

    def call() -> None:
        optimizer.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=low):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), SETTINGS.max_grad_norm)
        optimizer.step()

    return call, torch.get_num_threads()


def worker(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """`ours-text`, `torch-text`, `ours-vit`, `torch-vit`: one side's step times."""
    owner, kind = side.split("-")
    with tempfile.TemporaryDirectory() as scratch:
        if kind == "text":
            batch, path = text_batch(args.batch, args.tokens), hj.minilm_l6_path()
            model = hj.with_classifier(hj.from_pretrained(path), 2, jax.random.key(1))
        else:
            model = vit_model()
            batch, path = image_batch(model.config, args.vit_batch), Path(scratch)
            hj.save_pretrained(model, path)
        if owner == "ours":
            model, every = at_precision(model, args.dtype), args.steps_per_call
            one = time_calls(our_step(model, batch), args.repeats)
            return {"times": one, "per_step": per_step_times(model, batch, every, args.repeats)}
        call, threads = torch_step(path, kind, batch, args.dtype)
        return {"times": time_calls(call, args.repeats), "threads": threads}


def jax_only(args: argparse.Namespace) -> None:
    """The fused Hydra's step against the single model's; `fit` per step against the bare step."""
    path = hj.minilm_l6_path()
    single = hj.with_classifier(hj.from_pretrained(path), 2, jax.random.key(1))
    batch = text_batch(args.batch, args.tokens)
    L, N, M = 6, 12, 3
    sets = np.zeros((M, L, N), bool)
    for m in range(M):
        sets[m, :, m * 4 : (m + 1) * 4] = True
    fused = hj.hydra.fuse(hj.hydra.members_from(single, sets))
    programs = {"single step": our_step(single, batch), "fused Hydra step": our_step(fused, batch)}
    times = medians(interleaved(programs, repeats=args.repeats * args.rounds))
    print(f"\nJAX only, interleaved in one process, {args.repeats * args.rounds} rounds:")
    for name, t in times.items():
        print(f"  {name:<20}{t * 1e3:>10.1f} ms")
    print(f"  fused Hydra (M={M}) / single: {times['fused Hydra step'] / times['single step']:.3f}")

    # fit's own work per step (batching, dispatch, loss read-back, logging) over the bare step:
    # runs of n and 3n steps share the fixed costs (building the state, the loader's threads,
    # the one final checkpoint), so their difference over 2n is fit's time per step.
    n = args.fit_steps
    rng = np.random.default_rng(2)
    data = TokenizedSet([rng.integers(1000, 30000, args.tokens).astype(np.int32)
                         for _ in range(n * SETTINGS.batch_size)],
                        np.arange(n * SETTINGS.batch_size) % 2)  # fmt: skip
    runs = {}
    for epochs in (1.0, 3.0):
        settings = TrainSettings(epochs=epochs, batch_size=SETTINGS.batch_size, learning_rate=5e-5,
                                 checkpoint_every=100 * n, log_every=5)  # fmt: skip
        total = schedule_length(len(data), settings)[1]
        runs[total] = settings, make_train_step(single, make_optimizer(settings, total))
    walls: dict[int, list[float]] = {total: [] for total in runs}
    for r in range(args.rounds + 1):  # round 0 compiles and warms up: not counted
        for total, (settings, step_fn) in runs.items():
            with tempfile.TemporaryDirectory() as workdir:
                start = time.perf_counter()
                fit(single, data, settings, workdir, step_fn=step_fn)
                if r:
                    walls[total].append(time.perf_counter() - start)
    every = args.steps_per_call  # fit's calls: the bare step, called as fit calls it
    bare = statistics.median(per_step_times(single, batch, every, args.repeats))
    short, long = (statistics.median(walls[total]) for total in sorted(walls))
    per_step = (long - short) / (2 * n)
    print(
        f"\nfit, batch {SETTINGS.batch_size} x {args.tokens}, runs of {n} and {3 * n} steps "
        f"(log every 5, one final checkpoint), {args.rounds} rounds:"
    )
    print(
        f"  whole run of {n} steps: {short * 1e3:.0f} ms ({short / n * 1e3:.1f} ms per step, "
        f"{short / n / bare:.3f} x the bare step)"
    )
    print(f"  fit per step (3n-step run less the n-step run, over 2n): {per_step * 1e3:.1f} ms; "
          f"bare step ({every} per call) {bare * 1e3:.1f} ms; "
          f"ratio {per_step / bare:.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--vit-batch", type=int, default=64)
    parser.add_argument("--fit-steps", type=int, default=20)
    parser.add_argument("--steps-per-call", type=int, default=TrainSettings().steps_per_call)
    parser.add_argument("--only", default="text,vit,jax")
    parser.add_argument("--dtype", choices=PRECISIONS, default="float32")
    args = parser.parse_args(argv)
    if args.worker:
        print_worker(worker(args.worker, args))
        return
    forwarded = list(argv if argv is not None else sys.argv[1:])
    print(f"training steps, CPU {args.dtype}, {args.rounds} rounds of separate processes taken "
          f"in turns, {args.repeats} timed steps each (after 2 warm-up steps)")  # fmt: skip
    for kind in ("text", "vit"):
        if kind not in args.only:
            continue
        results = alternating("bench.train", [f"ours-{kind}", f"torch-{kind}"], forwarded,
                              args.rounds)  # fmt: skip
        ours, theirs = median_of(results[f"ours-{kind}"]), median_of(results[f"torch-{kind}"])
        calls = median_of(results[f"ours-{kind}"], "per_step")
        shape = (f"MiniLM-L6, batch {args.batch} x {args.tokens}" if kind == "text"
                 else f"study ViT, batch {args.vit_batch}")  # fmt: skip
        threads = results[f"torch-{kind}"][0]["threads"]
        print(f"\n{shape}: transformers + torch AdamW {theirs * 1e3:.1f} ms ({threads} threads);"
              f"\n  ours, one step per call: {ours * 1e3:.1f} ms, ours / torch "
              f"{ours / theirs:.3f}\n  ours, {args.steps_per_call} steps per call (fit's): "
              f"{calls * 1e3:.1f} ms per step, ours / torch {calls / theirs:.3f}")  # fmt: skip
    if "jax" in args.only:
        jax_only(args)


if __name__ == "__main__":
    main()
