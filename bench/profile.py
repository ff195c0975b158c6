"""Where a jitted forward spends its time on this CPU: MiniLM-L6 (batch 32 x 64 tokens) or the
Fashion-MNIST ViT of `configs/vit_fmnist.py` (256 images, random weights), fp32.

Traces a few calls with `jax.profiler`, reads the trace (`jax.profiler.ProfileData`), and sums
each executed XLA fusion's time by what its fused computation contains: matrix products alone,
matrix products fused with the softmax (XLA:CPU fuses the attention scores with it), other
softmax parts, layouts (transposes, copies), other element-wise work (GELU, LayerNorm, biases).
Run it on both kinds of CPU to see whether a gap to PyTorch comes from the matmul kernels
(XLA's) or from the rest (ours).

    .venv/bin/python -m bench.profile [--calls 5] [--model vit]
"""

from __future__ import annotations

import argparse
import collections
import re
import tempfile
from pathlib import Path

import jax
import numpy as np

import hydra_jax as hj
from configs import vit_fmnist
from hydra_jax.data import random_tokens
from hydra_jax.experiments import common
from hydra_jax.models import with_classifier

NOT_OPS = {"parameter", "bitcast", "broadcast", "constant", "reshape", "tuple", "get-tuple-element"}


def fused_ops(hlo: str) -> dict[str, collections.Counter]:
    """`{fusion instruction name: ops of its fused computation}` from optimised HLO text."""
    calls = dict(re.findall(r"\n\s*%?(\S+) = [^\n]*? fusion\([^\n]*calls=%?([\w.\-]+)", hlo))
    bodies = dict(re.findall(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S))
    return {
        name: collections.Counter(
            op
            for op in re.findall(r"= \S+ (\w[\w-]*)\(", bodies.get(body, ""))
            if op not in NOT_OPS
        )
        for name, body in calls.items()
    }


def category(ops: collections.Counter) -> str:
    if ("dot" in ops or "convolution" in ops) and "exponential" in ops:
        return "matmul + softmax (attention scores)"
    if "dot" in ops or "convolution" in ops:
        return "matmul"
    if "exponential" in ops:
        return "softmax (rest)"
    if "erf" in ops or "tanh" in ops:
        return "GELU"
    if "transpose" in ops or "copy" in ops:
        return "layout (transpose, copy)"
    if "rsqrt" in ops:
        return "LayerNorm"
    return "other element-wise and reductions"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--model", choices=("minilm", "vit"), default="minilm")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.model == "minilm":
        model = with_classifier(hj.from_pretrained(hj.minilm_l6_path()), 2, jax.random.key(0))
        batch, what = random_tokens(rng, 32, 64), "MiniLM-L6 forward, batch 32 x 64 tokens"
    else:
        model = hj.Model.init(common.scratch_config(vit_fmnist.get_config()), jax.random.key(0))
        size = model.config.image_size
        pixels = rng.standard_normal((256, model.config.num_channels, size, size))
        batch, what = {"pixel_values": pixels.astype(np.float32)}, "ViT forward, 256 images"
    forward = jax.jit(lambda p, b: model.apply(p, **b).logits)
    ops = fused_ops(forward.lower(model.params, batch).compile().as_text())
    for _ in range(3):
        jax.block_until_ready(forward(model.params, batch))
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory):
            for _ in range(args.calls):
                jax.block_until_ready(forward(model.params, batch))
        trace = next(Path(directory).rglob("*.xplane.pb"))
        data = jax.profiler.ProfileData.from_file(str(trace))
    seconds: collections.Counter = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                name = event.name
                if name in ops:  # an executed fusion (any thread)
                    seconds[category(ops[name])] += event.duration_ns / 1e9 / args.calls
                elif re.fullmatch(r"[a-z_]+\.\d+", name) and not name.startswith("end"):
                    seconds["unfused ops"] += event.duration_ns / 1e9 / args.calls
    total = sum(seconds.values())
    print(f"{what}, CPU fp32: {total * 1e3:.1f} ms of XLA ops "
          f"per call (summed over threads), by what each fusion computes:")  # fmt: skip
    for name, s in seconds.most_common():
        print(f"  {name:<38}{s * 1e3:>9.1f} ms {100 * s / total:>6.1f}%")


if __name__ == "__main__":
    main()
