"""A change to the training step, measured: the step of two source trees, of one tree compiled
with different XLA options, or of one tree in two compute dtypes, in separate processes taken in
turns (bench/processes.py).

Each side's worker runs in its own process, from its tree (`--trees`: the worker starts in that
directory with it on `PYTHONPATH`, so `hydra_jax` and `bench` are imported from it; the tree need
not contain this file), with its options (`--options`: JSON objects of XLA compile options, `{}` for
the default) or in its dtype (`--dtypes`; otherwise every side computes in `--dtype`), builds the
studies' step (`bench/train.py`'s `step_and_state`: AdamW, clipping, dropout) of MiniLM-L6 + a
classifier (batch 32 x 64 tokens) or of the study ViT (batch 64) computing in that dtype
(`hj.with_dtype`; `bfloat16:bfloat16` for bf16 hidden states), and times `--repeats` calls after two
warm-up calls (`our_step`). Sides alternate, reversing every round; each side's median over all its
calls is compared with the first side's. The method of the "tried" table of docs/benchmarks.md.

    .venv/bin/python -m bench.ab --model vit --trees /path/to/before /path/to/after \
        [--dtype bfloat16]
    .venv/bin/python -m bench.ab --model minilm --options '{}' \
        '{"xla_cpu_multi_thread_eigen": false}' [--rounds 4] [--repeats 5]
    .venv/bin/python -m bench.ab --model vit --dtypes float32 bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

# The worker runs this file from the tree it measures, which need not contain it: run by path
# without putting its folder on `sys.path`, so `bench` and `hydra_jax` come from that tree.
RUN_WORKER = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


# a compute dtype, or "DTYPE:HIDDEN" (bench/precision.py's `PRECISIONS`; not imported: the
# measured trees may not have it)
DTYPES = ("float32", "bfloat16", "bfloat16:bfloat16")


def worker(
    model_name: str, options: dict[str, Any], repeats: int, dtype: str = "float32"
) -> dict[str, Any]:
    """One side's step times (this process's tree, these compile options, compute dtype)."""
    import jax

    import hydra_jax as hj
    from bench.processes import time_calls

    # Only names every measured tree's bench/train.py has: the trees may be older than this file.
    from bench.train import image_batch, our_step, step_and_state, text_batch, vit_model

    if model_name == "vit":
        model = vit_model()
        batch = image_batch(model.config, 64)
    else:
        model = hj.with_classifier(hj.from_pretrained(hj.minilm_l6_path()), 2, jax.random.key(1))
        batch = text_batch(32, 64)
    dtype, _, hidden = dtype.partition(":")  # a tree older than `hidden` takes a dtype alone
    model = hj.with_dtype(model, dtype, hidden) if hidden else hj.with_dtype(model, dtype)
    step, start = step_and_state(model)
    single = getattr(step, "single", step)  # a `TrainStep`, or an older tree's jitted step
    compiled = single.lower(start, batch, jax.random.key(0)).compile(options or None)
    return {"times": time_calls(our_step(model, batch, (compiled, start)), repeats)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=("minilm", "vit"), default="vit")
    sides = parser.add_mutually_exclusive_group()
    sides.add_argument("--trees", nargs="+", type=Path, metavar="DIR")
    sides.add_argument("--options", nargs="+", metavar="JSON")
    sides.add_argument("--dtypes", nargs="+", choices=DTYPES)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.model, json.loads(args.worker), args.repeats, args.dtype)))
        return
    if not (args.trees or args.options or args.dtypes):
        parser.error(
            "give the sides to compare: --trees DIR DIR ..., --options JSON JSON ... or "
            "--dtypes DTYPE DTYPE ..."
        )
    for options in args.options or ():
        try:
            valid = isinstance(json.loads(options), dict)
        except json.JSONDecodeError:
            valid = False
        if not valid:
            parser.error(f"--options takes JSON objects of XLA compile options, not {options!r}")
    if args.trees:
        named = {str(tree): (tree.resolve(), "{}", args.dtype) for tree in args.trees}
    elif args.options:
        named = {options: (Path.cwd(), options, args.dtype) for options in args.options}
    else:
        named = {dtype: (Path.cwd(), "{}", dtype) for dtype in args.dtypes}
    times: dict[str, list[float]] = {name: [] for name in named}
    order = list(named)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            tree, options, dtype = named[name]
            argv = ["--model", args.model, "--repeats", str(args.repeats), "--dtype", dtype,
                    "--worker", options]  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-c", RUN_WORKER, str(Path(__file__).resolve()), *argv],
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode:
                raise RuntimeError(f"the worker of {name} failed:\n{done.stderr[-3000:]}")
            times[name] += json.loads(done.stdout.strip().splitlines()[-1])["times"]
    base = statistics.median(times[order[0]])
    dtypes = ", ".join(args.dtypes or [args.dtype])
    print(f"{args.model} training step, {dtypes}, {args.rounds} rounds of {args.repeats} "
          "calls per side, separate processes in turns; median, ratio to the first")  # fmt: skip
    for name in order:
        median = statistics.median(times[name])
        print(f"  {median * 1e3:8.1f} ms  {median / base:6.3f}  {name}")


if __name__ == "__main__":
    main()
