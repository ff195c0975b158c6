"""fp32 vs bf16 compute for single, fused Hydra and Deep Ensemble.

MiniLM-L6 (real weights, random classifier; batch 32 x 64 tokens) and the ViT of
`configs/vit_fmnist.py` (random weights; batch 64 images of 28 x 28), each program at each
precision of `PRECISIONS` (`at_precision`): fp32; bf16 dense products with fp32 hidden states
(`hj.with_dtype(model, "bfloat16")`); bf16 hidden states too (`"bfloat16:bfloat16"`). Interleaved
rounds (bench/timing.py); medians; each precision's time over fp32's per program, and Hydra /
single and Hydra / Deep Ensemble at each. `measure` and `at_precision` are shared with the
other benchmarks.

    .venv/bin/python -m bench.precision [--repeats 20] [--batch 32] [--tokens 64]
        [--only minilm|vit]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import jax
import numpy as np

import hydra_jax as hj
from bench.timing import interleaved, medians
from configs import vit_fmnist
from hydra_jax import hydra
from hydra_jax.data import random_tokens
from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import xla_flops
from hydra_jax.experiments import artefacts
from hydra_jax.models import Model, with_classifier, with_dtype

PROGRAMS = ("single", "hydra", "deep_ensemble")
# a compute dtype (bf16: dense products only, fp32 hidden states), or "DTYPE:HIDDEN"
PRECISIONS = ("float32", "bfloat16", "bfloat16:bfloat16")


def at_precision(model: Model, precision: str) -> Model:
    """`model` computing at `precision`, one of `PRECISIONS`: "DTYPE" is `with_dtype(model,
    DTYPE)`, "DTYPE:HIDDEN" is `with_dtype(model, DTYPE, HIDDEN)`."""
    dtype, _, hidden = precision.partition(":")
    return with_dtype(model, dtype, hidden) if hidden else with_dtype(model, dtype)


def programs(single: Model, members: list[Model], M: int, precision: str) -> dict:
    """`{name: (forward(weights, batch), weights)}` for single, fused Hydra (M members keeping
    N / M heads, disjoint sets) and the vmapped Deep Ensemble of `members`, computing at
    `precision`."""
    single = at_precision(single, precision)
    L, N = single.config.encoder.num_layers, single.config.encoder.num_heads[0]
    sets = hydra.stratified_head_sets(np.random.default_rng(0).random((L, N)), M)
    fused = hydra.fuse(hydra.members_from(single, sets))
    return {
        "single": (baselines.single(single), single.params),
        "hydra": (lambda p, b: fused.apply(p, **b).logits, fused.params),
        "deep_ensemble": (baselines.deep_ensemble(single), baselines.stack(members)),
    }


def measure(
    single: Model,
    members: list[Model],
    batch: Mapping[str, np.ndarray],
    dtypes: tuple[str, ...],
    M: int = 3,
    repeats: int = 20,
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds and XLA FLOPs of every `(program, dtype)`, named `"program dtype"`,
    timed in interleaved rounds."""
    compiled = {}
    for dtype in dtypes:
        for name, (f, w) in programs(single, members, M, dtype).items():
            compiled[f"{name} {dtype}"] = (jax.jit(f).lower(w, batch).compile(), w)
    flops = {name: xla_flops(c) for name, (c, _) in compiled.items()}
    calls = {
        name: (lambda c=c, w=w: jax.block_until_ready(c(w, batch)))
        for name, (c, w) in compiled.items()
    }
    return medians(interleaved(calls, repeats=repeats)), flops


def report(title: str, times: dict[str, float], dtypes: tuple[str, ...]) -> None:
    """One row per program: each of `dtypes`' median, then the others' over the first's."""
    print(title)
    header = "".join(f"{d + ' ms':>22}" for d in dtypes)
    ratios = "".join(f"{d + ' / ' + dtypes[0]:>28}" for d in dtypes[1:])
    print(f"{'program':<16}{header}{ratios}")
    for p in PROGRAMS:
        row = "".join(f"{times[f'{p} {d}'] * 1e3:>22.1f}" for d in dtypes)
        row += "".join(
            f"{times[f'{p} {d}'] / times[f'{p} {dtypes[0]}']:>28.3f}" for d in dtypes[1:]
        )
        print(f"{p:<16}{row}")
    for d in dtypes:
        hydra_single = times[f"hydra {d}"] / times[f"single {d}"]
        hydra_de = times[f"hydra {d}"] / times[f"deep_ensemble {d}"]
        print(f"{d}: hydra / single {hydra_single:.3f}, hydra / deep_ensemble {hydra_de:.3f}")


def minilm(
    M: int, batch: int = 32, tokens: int = 64
) -> tuple[Model, list[Model], dict[str, np.ndarray]]:
    base = hj.from_pretrained(hj.minilm_l6_path())
    members = [with_classifier(base, 2, jax.random.key(m)) for m in range(M)]
    return members[0], members, random_tokens(np.random.default_rng(0), batch, tokens)


def vit(M: int) -> tuple[Model, list[Model], dict[str, np.ndarray]]:
    config = artefacts.scratch_config(vit_fmnist.get_config())
    members = [Model.init(config, jax.random.key(m)) for m in range(M)]
    images = np.random.default_rng(0).normal(size=(64, config.num_channels, 28, 28))
    return members[0], members, {"pixel_values": images.astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="MiniLM's batch")
    parser.add_argument("--tokens", type=int, default=64, help="MiniLM's sequence length")
    parser.add_argument("--only", choices=("minilm", "vit"), help="one model alone")
    args = parser.parse_args()
    dtypes = PRECISIONS
    models = {
        "minilm": (f"MiniLM-L6, batch {args.batch} x {args.tokens} tokens",
                   lambda M: minilm(M, args.batch, args.tokens)),
        "vit": ("ViT of configs/vit_fmnist.py, batch 64 x 28 x 28", vit),
    }  # fmt: skip
    for name, (title, build) in models.items():
        if args.only not in (None, name):
            continue
        single, members, batch = build(3)
        times, _ = measure(single, members, batch, dtypes, repeats=args.repeats)
        report(f"{title}, CPU, {args.repeats} interleaved rounds", times, dtypes)


if __name__ == "__main__":
    main()
