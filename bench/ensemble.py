"""Ensemble costs: single, fused Hydra, Deep Ensemble (vmapped and sequential), MC dropout
(samples run by `lax.map`, as in the library, and `vmap`ped), and the single-pass ensembles
BatchEnsemble, LoRA-Ensemble (rank 8 on q, k, v, out) and Packed-Ensembles (alpha 2, or 3
where 2 does not divide the width into the members' heads; gamma 2) at the same M (and MIMO,
on an image classifier: `bench/vision.py`).

MiniLM-L6 shapes (real weights, random classifier), batch 32 x 64 tokens, CPU fp32, interleaved
rounds; medians, XLA FLOPs, and each latency ratio divided by its FLOP ratio. Targets (SPEC
section 10): Hydra / single <= 1.1 x its FLOP ratio; Hydra / Deep Ensemble <= 0.85, against both
the vmapped and the sequential Deep Ensemble (whichever is faster on the machine). Programs run in
a random order in each round (bench/timing.py).
Also times the circuit search against L x N full forward passes over the same examples
(target <= 0.7).

    .venv/bin/python -m bench.ensemble [--repeats 20] [--circuit-examples 128]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import hydra_jax as hj
from bench.timing import interleaved, medians
from hydra_jax import hydra
from hydra_jax.data import TokenizedSet, random_tokens, uncertainty_batches
from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import xla_flops
from hydra_jax.heads import CircuitSearch
from hydra_jax.models import ViTConfig, with_classifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--mc-samples", type=int, default=10)
    parser.add_argument("--circuit-examples", type=int, default=128)
    parser.add_argument("--circuit-repeats", type=int, default=3)
    args = parser.parse_args()
    M = args.members

    base = hj.from_pretrained(hj.minilm_l6_path())
    members = [with_classifier(base, 2, jax.random.key(m)) for m in range(M)]
    single = members[0]
    L, N = single.config.encoder.num_layers, single.config.encoder.num_heads[0]
    sets = hydra.stratified_head_sets(np.random.default_rng(0).random((L, N)), M)
    fused = hydra.fuse(hydra.members_from(single, sets))
    batch = random_tokens(np.random.default_rng(0), 32, 64)

    forwards = {
        "single": (baselines.single(single), single.params),
        f"hydra (M={M}, {N // M} heads)": (lambda p, b: fused.apply(p, **b).logits, fused.params),
        "deep_ensemble (vmap)": (baselines.deep_ensemble(single), baselines.stack(members)),
        f"mc_dropout ({args.mc_samples}, lax.map)": (
            baselines.mc_dropout(single, args.mc_samples),
            single.params,
        ),
        f"mc_dropout ({args.mc_samples}, vmap)": (
            vmapped_mc_dropout(single, args.mc_samples),
            single.params,
        ),
        **efficient_forwards(single, M),
    }
    compiled = {
        name: (jax.jit(f).lower(w, batch).compile(), w) for name, (f, w) in forwards.items()
    }
    flops = {name: xla_flops(c) for name, (c, _) in compiled.items()}
    programs = {
        name: (lambda c=c, w=w: jax.block_until_ready(c(w, batch)))
        for name, (c, w) in compiled.items()
    }
    one, params = compiled["single"][0], [m.params for m in members]
    programs["deep_ensemble (sequential)"] = lambda: [
        jax.block_until_ready(one(p, batch)) for p in params
    ]
    flops["deep_ensemble (sequential)"] = M * flops["single"]

    times = medians(interleaved(programs, repeats=args.repeats))
    print(f"MiniLM-L6, batch 32 x 64 tokens, CPU fp32, {args.repeats} interleaved rounds")
    print(f"{'program':<30}{'median ms':>11}{'GFLOP':>9}{'vs single':>11}{'/ FLOP ratio':>14}")
    for name, t in times.items():
        ratio = t / times["single"]
        flop_ratio = flops[name] / flops["single"]
        print(f"{name:<30}{t * 1e3:>11.1f}{flops[name] / 1e9:>9.2f}{ratio:>11.3f}"
              f"{ratio / flop_ratio:>14.3f}")  # fmt: skip
    hydra_name = next(n for n in times if n.startswith("hydra"))
    for de in ("deep_ensemble (vmap)", "deep_ensemble (sequential)"):
        print(f"hydra / {de} latency: {times[hydra_name] / times[de]:.3f} (target <= 0.85)")
    compare_efficient(times, flops, hydra_name)
    hydra_ratio = times[hydra_name] / times["single"]
    flop_ratio = flops[hydra_name] / flops["single"]
    print(f"hydra / single latency {hydra_ratio:.3f} = {hydra_ratio / flop_ratio:.3f} x its FLOP "
          f"ratio {flop_ratio:.3f} (target <= 1.1 x)")  # fmt: skip
    circuit(single, args.circuit_examples, args.circuit_repeats)


def efficient_forwards(single: hj.Model, M: int) -> dict[str, tuple]:
    """BatchEnsemble and LoRA-Ensemble (rank 8) of `M` members from `single`, and a
    Packed-Ensemble and (an image classifier) MIMO of its architecture: `{name: (forward,
    weights)}`. The adapters are perturbed
    from the neutral start (LoRA's B is 0 there), which changes no timing but keeps XLA from
    simplifying anything away."""
    out = {}
    for name, ensemble in (
        ("batch_ensemble", hydra.batch_ensemble(single, M, jax.random.key(0))),
        ("lora_ensemble", hydra.lora_ensemble(single, M, jax.random.key(0), rank=8)),
    ):
        adapters = jax.tree.map(lambda x: x + 0.01, ensemble.params["members"]["adapters"])
        params = {**ensemble.params, "members": {**ensemble.params["members"],
                                                 "adapters": adapters}}  # fmt: skip
        out[f"{name} (M={M})"] = (lambda p, b, e=ensemble: e.apply(p, **b).logits, params)
    for alpha in (2.0, 3.0):
        try:
            packed = hydra.packed_ensemble(single.config, M, jax.random.key(0), alpha, groups=2)
        except ValueError:  # the width does not divide at this alpha
            continue
        name = f"packed_ensemble (M={M}, alpha={alpha:g}, gamma=2)"
        out[name] = (lambda p, b, e=packed: e.apply(p, **b).logits, packed.params)
        break
    if isinstance(single.config, ViTConfig):  # MIMO widens an image classifier
        mimo = hydra.mimo(single.config, M, jax.random.key(0))
        out[f"mimo (M={M})"] = (lambda p, b, e=mimo: e.apply(p, **b).logits, mimo.params)
    return out


def compare_efficient(times: dict[str, float], flops: dict[str, float], hydra_name: str) -> None:
    """Hydra against each single-pass ensemble (latency and FLOPs), and each against single."""
    for name in (n for n in times if n.startswith(("batch_", "lora_", "packed_", "mimo"))):
        print(f"hydra / {name}: latency {times[hydra_name] / times[name]:.3f}, FLOPs "
              f"{flops[hydra_name] / flops[name]:.3f}; {name} / single: latency "
              f"{times[name] / times['single']:.3f}")  # fmt: skip


def vmapped_mc_dropout(model: hj.Model, samples: int) -> baselines.Forward:
    """`baselines.mc_dropout` with the samples `vmap`ped (the same keys, so the same outputs)."""
    keys = jax.random.split(jax.random.key(0), samples)

    def forward(params, batch):
        member = lambda k: model.apply(params, **batch, dropout_rng=k).logits  # noqa: E731
        return jax.vmap(member, out_axes=1)(keys)

    return forward


def circuit(model: hj.Model, examples: int, repeats: int) -> None:
    """Circuit search vs L x N full forward passes over the same examples, interleaved."""
    rng = np.random.default_rng(1)
    tokens = [
        np.r_[101, rng.integers(1000, 30000, rng.integers(8, 40)), 102] for _ in range(examples)
    ]
    half = examples // 2
    id_set = TokenizedSet(tokens[:half], rng.integers(0, 2, half))
    ood_set = TokenizedSet(tokens[half:], np.zeros(examples - half, np.int64))
    data = uncertainty_batches(id_set, ood_set, batch_size=64)
    L, N = model.config.encoder.num_layers, model.config.encoder.num_heads[0]
    forward = jax.jit(lambda p, m, b: model.apply(p, **b, head_mask=m).logits)
    inputs = [{k: v for k, v in b.items() if k != "labels"} for b in data.batches]
    masks = np.ones((L * N, L, N), np.float32)
    masks[np.arange(L * N), np.repeat(np.arange(L), N), np.tile(np.arange(N), L)] = 0.0

    def full_passes() -> None:
        for mask in masks:
            for b in inputs:
                jax.block_until_ready(forward(model.params, mask, b))

    searcher = CircuitSearch(model)  # compiled in the warm-up round, as full_passes' forward

    def search() -> None:
        searcher(data, keep_per_layer=N // 3, objective="avg")

    start = time.perf_counter()
    times = medians(interleaved({"circuit search": search, "L x N full forwards": full_passes},
                                repeats=repeats, warmup=1))  # fmt: skip
    ratio = times["circuit search"] / times["L x N full forwards"]
    print(f"circuit search over {examples} examples: {times['circuit search']:.1f} s; "
          f"{L * N} full forwards: {times['L x N full forwards']:.1f} s; ratio {ratio:.3f} "
          f"(target <= 0.7); bench wall {time.perf_counter() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
