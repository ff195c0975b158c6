"""The Fashion-MNIST ViT: our jit-compiled forward vs `transformers`' PyTorch ViT of the same
published checkpoint, and the fused ViT Hydra vs the single ViT and the Deep Ensemble.

CPU, fp32, batch 256 images 28x28, interleaved rounds (bench/timing.py); medians, XLA FLOPs,
ratios. Targets: ours <= 1.0x PyTorch; Hydra / Deep Ensemble <= 0.85. Reads the published ViT of
`make vision` (or `--checkpoint`); without one, a randomly initialised ViT of
`configs/vit_fmnist.py` (timings do not depend on the weights' values).

    .venv/bin/python -m bench.vision [--repeats 20] [--checkpoint runs/vit_fmnist/hf/member_0]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import numpy as np
import torch
import transformers

import hydra_jax as hj
from bench.timing import interleaved, medians
from configs import vit_fmnist
from hydra_jax import hydra
from hydra_jax.ensembles import baselines
from hydra_jax.evaluation import xla_flops
from hydra_jax.experiments import artefacts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--checkpoint", default="runs/vit_fmnist/hf/member_0")
    args = parser.parse_args()
    M = args.members

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(args.checkpoint)
        if not (path / "config.json").is_file():
            config = vit_fmnist.get_config()
            path = Path(scratch)
            model = hj.Model.init(artefacts.scratch_config(config), jax.random.key(0))
            artefacts.publish(model, path, our_pixels=True)
            print(f"no checkpoint at {args.checkpoint}: a random ViT of configs/vit_fmnist.py")
        single = hj.from_pretrained(path)
        reference = transformers.ViTForImageClassification.from_pretrained(path).eval()
    c = single.config
    shape = (args.batch, c.num_channels, c.image_size, c.image_size)
    pixels = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    batch = {"pixel_values": pixels}
    torch_pixels = torch.tensor(pixels)

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

    def run_torch() -> None:
        with torch.inference_mode():
            reference(pixel_values=torch_pixels)

    programs["transformers single (torch)"] = run_torch
    with torch.inference_mode():
        expected = reference(pixel_values=torch_pixels).logits.numpy()
    diff = np.abs(np.asarray(one(single.params, batch))[:, 0] - expected).max()

    times = medians(interleaved(programs, repeats=args.repeats))
    print(f"ViT {L} layers x {N} heads, patch {c.patch_size}, batch {args.batch} x "
          f"{c.image_size}x{c.image_size}, CPU fp32, {args.repeats} interleaved rounds; torch "
          f"threads {torch.get_num_threads()}")  # fmt: skip
    print(f"max |ours - torch| on the logits: {diff:.2e}")
    print(f"{'program':<30}{'median ms':>11}{'MFLOP':>10}{'vs single':>11}")
    for name, t in times.items():
        mflop = f"{flops[name] / 1e6:>10.1f}" if name in flops else f"{'-':>10}"
        print(f"{name:<30}{t * 1e3:>11.2f}{mflop}{t / times['single']:>11.3f}")
    print(f"ours / torch (single ViT): {times['single'] / times['transformers single (torch)']:.3f}"
          " (target <= 1.0)")  # fmt: skip
    hydra_name = next(n for n in times if n.startswith("hydra"))
    for de in ("deep_ensemble (vmap)", "deep_ensemble (sequential)"):
        print(f"hydra / {de}: latency {times[hydra_name] / times[de]:.3f} (target <= 0.85), "
              f"FLOPs {flops[hydra_name] / flops[de]:.3f}")  # fmt: skip
    print(f"hydra / single: latency {times[hydra_name] / times['single']:.3f}, FLOPs "
          f"{flops[hydra_name] / flops['single']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
