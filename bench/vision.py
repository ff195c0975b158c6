"""The Fashion-MNIST ViT: our jit-compiled forward vs `transformers`' PyTorch ViT of the same
published checkpoint, and the fused ViT Hydra vs the single ViT and the Deep Ensemble.

CPU, fp32, batch 256 images 28x28; medians, XLA FLOPs, ratios. The JAX programs run interleaved
in this process (bench/timing.py); ours against PyTorch in separate processes taken in turns
(bench/processes.py: PyTorch's spinning OpenMP threads would slow an XLA program in the same
process). Targets: ours <= 1.0x PyTorch; Hydra / Deep Ensemble <= 0.85. Reads the published
ViT of `make vision` (or `--checkpoint`); without one, a randomly initialised ViT of
`configs/vit_fmnist.py` (timings do not depend on the weights' values).

    .venv/bin/python -m bench.vision [--repeats 20] [--rounds 4]
        [--checkpoint runs/vit_fmnist/hf/member_0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

import hydra_jax as hj
from bench.ensemble import compare_efficient, efficient_forwards
from bench.processes import alternating, median_of, print_worker, time_calls
from bench.timing import interleaved, medians
from configs import vit_fmnist
from hydra_jax import hydra
from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import xla_flops
from hydra_jax.experiments import artefacts


def pixels_of(config: Any, batch: int) -> np.ndarray:
    shape = (batch, config.num_channels, config.image_size, config.image_size)
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def worker(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side's single-ViT forward times; its logits go to `args.out/SIDE.npy`."""
    path = Path(args.checkpoint)
    if side == "ours":
        model = hj.from_pretrained(path)
        batch = {"pixel_values": pixels_of(model.config, args.batch)}
        compiled = jax.jit(lambda p, b: model.apply(p, **b).logits).lower(model.params, batch)
        forward = compiled.compile()
        np.save(Path(args.out) / "ours.npy", np.asarray(forward(model.params, batch)))
        times = time_calls(lambda: jax.block_until_ready(forward(model.params, batch)),
                           args.repeats)  # fmt: skip
        return {"times": times}
    import torch
    import transformers

    reference = transformers.ViTForImageClassification.from_pretrained(path).eval()
    inputs = torch.tensor(pixels_of(reference.config, args.batch))

    def run() -> Any:
        with torch.inference_mode():
            return reference(pixel_values=inputs).logits

    np.save(Path(args.out) / "torch.npy", run().numpy())
    return {"times": time_calls(run, args.repeats), "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--checkpoint", default="runs/vit_fmnist/hf/member_0")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if args.worker:
        print_worker(worker(args.worker, args))
        return
    M = args.members

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(args.checkpoint)
        if not (path / "config.json").is_file():
            config = vit_fmnist.get_config()
            path = Path(scratch) / "vit"
            model = hj.Model.init(artefacts.scratch_config(config), jax.random.key(0))
            artefacts.publish(model, path, our_pixels=True)
            print(f"no checkpoint at {args.checkpoint}: a random ViT of configs/vit_fmnist.py")
        single = hj.from_pretrained(path)
        forwarded = [*(argv if argv is not None else sys.argv[1:]), "--out", scratch,
                     "--checkpoint", str(path)]  # fmt: skip
        sides = alternating("bench.vision", ["ours", "torch"], forwarded, args.rounds)
        diff = np.abs(np.load(Path(scratch) / "ours.npy") - np.load(Path(scratch) / "torch.npy"))
    ours, theirs = median_of(sides["ours"]), median_of(sides["torch"])
    c = single.config
    batch = {"pixel_values": pixels_of(c, args.batch)}

    members = [single] + [
        hj.Model(c, jax.tree.map(lambda x, k=k: x + 0.01 * k, single.params)) for k in range(1, M)
    ]  # distinct weights; values do not change the timings
    L, N = c.encoder.num_layers, c.encoder.num_heads[0]
    sets = hydra.stratified_head_sets(np.random.default_rng(0).random((L, N)), M)
    fused = hydra.fuse(hydra.members_from(single, sets))
    forwards = {
        "single": (baselines.single(single), single.params),
        f"hydra (M={M}, {N // M} heads)": (lambda p, b: fused.apply(p, **b).logits, fused.params),
        "deep_ensemble (vmap)": (baselines.deep_ensemble(single), baselines.stack(members)),
        **efficient_forwards(single, M),
    }
    compiled = {
        name: (jax.jit(f).lower(w, batch).compile(), w) for name, (f, w) in forwards.items()
    }
    flops = {name: xla_flops(fn) for name, (fn, _) in compiled.items()}
    programs = {
        name: (lambda fn=fn, w=w: jax.block_until_ready(fn(w, batch)))
        for name, (fn, w) in compiled.items()
    }
    one = compiled["single"][0]
    programs["deep_ensemble (sequential)"] = lambda: [
        jax.block_until_ready(one(m.params, batch)) for m in members
    ]
    flops["deep_ensemble (sequential)"] = M * flops["single"]

    times = medians(interleaved(programs, repeats=args.repeats))
    print(f"ViT {L} layers x {N} heads, patch {c.patch_size}, batch {args.batch} x "
          f"{c.image_size}x{c.image_size}, CPU fp32; JAX programs {args.repeats} interleaved "
          f"rounds; ours vs torch {args.rounds} rounds of separate processes taken in turns, "
          f"torch threads {sides['torch'][0]['threads']}")  # fmt: skip
    print(f"max |ours - torch| on the logits: {diff.max():.2e}")
    print(f"{'program':<30}{'median ms':>11}{'MFLOP':>10}{'vs single':>11}")
    for name, t in times.items():
        print(f"{name:<30}{t * 1e3:>11.2f}{flops[name] / 1e6:>10.1f}{t / times['single']:>11.3f}")
    print(f"single ViT, separate processes: ours {ours * 1e3:.2f} ms, transformers (torch) "
          f"{theirs * 1e3:.2f} ms; ours / torch {ours / theirs:.3f} (target <= 1.0)")  # fmt: skip
    hydra_name = next(n for n in times if n.startswith("hydra"))
    for de in ("deep_ensemble (vmap)", "deep_ensemble (sequential)"):
        print(f"hydra / {de}: latency {times[hydra_name] / times[de]:.3f} (target <= 0.85), "
              f"FLOPs {flops[hydra_name] / flops[de]:.3f}")  # fmt: skip
    print(f"hydra / single: latency {times[hydra_name] / times['single']:.3f}, FLOPs "
          f"{flops[hydra_name] / flops['single']:.3f}")  # fmt: skip
    compare_efficient(times, flops, hydra_name)


if __name__ == "__main__":
    main()
