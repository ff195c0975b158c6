"""Where a jitted forward or training step spends its time on this CPU: MiniLM-L6 (batch 32 x 64
tokens), the Fashion-MNIST ViT of `configs/vit_fmnist.py` (256 images, random weights; 64 for a
step) or a random DINOv2-S (8 images of 224 px, 257 tokens; built with `transformers`, as
`bench/forward.py` does), fp32 or `--dtype bfloat16[:bfloat16]` (`bench.precision`'s
`at_precision`). `--step` profiles `bench/train.py`'s training step instead (value and gradient
with dropout, clipping, AdamW) and lists its costliest fusions.

Traces a few calls with `jax.profiler`, reads the trace (`jax.profiler.ProfileData`), and sums
each executed XLA fusion's time by what its fused computation contains: matrix products alone,
matrix products fused with the softmax (XLA:CPU fuses the attention scores with it), other
softmax parts, layouts (transposes, copies), other element-wise work (GELU, LayerNorm, biases).
For MiniLM it then profiles the `transformers` PyTorch forward of the same checkpoint on the
same tokens (`torch.profiler`, each aten op's own time summed by kind), so the two libraries'
time in matrix products and in the rest can be compared side by side. Run it on both kinds of
CPU to see whether a gap to PyTorch comes from the matmul kernels (XLA's) or from the rest (ours).

XLA:CPU's matrix-product kernels record an event on the thread that dispatches them only, so
the times are of traced work: a product both threads compute counts once.

    .venv/bin/python -m bench.profile [--calls 5] [--model vit|dinov2] [--step] [--dtype bfloat16]
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
from bench.forward import dinov2_small
from bench.precision import PRECISIONS, at_precision
from bench.train import our_step, step_and_state
from configs import vit_fmnist
from hydra_jax.data import random_tokens
from hydra_jax.experiments import artefacts
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


# A layout fusion with more element-wise work than this is a producer chain (a LayerNorm or
# dropout backward, say) that XLA fused into a transpose: its reads are strided.
CHAIN = 4


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
        if sum(ops.values()) - ops["transpose"] - ops["copy"] > CHAIN:
            return "element-wise chain fused into a transpose"
        return "layout (transpose, copy)"
    if "rsqrt" in ops:
        return "LayerNorm"
    return "other element-wise and reductions"


def torch_category(op: str) -> str:
    if op in ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"):
        return "matmul (addmm: dense layers with their bias)"
    if "scaled_dot_product" in op:
        return "attention (fused SDPA: both products and the softmax)"
    if op == "aten::gelu":
        return "GELU"
    if op in ("aten::copy_", "aten::contiguous", "aten::clone"):
        return "layout (copy)"
    if "layer_norm" in op:
        return "LayerNorm"
    return "other (element-wise, embeddings, dispatch)"


def torch_profile(batch: dict[str, np.ndarray], calls: int) -> tuple[collections.Counter, int]:
    """Milliseconds per call of the `transformers` MiniLM-L6 forward of `batch` (our token
    arrays) by kind of aten op, and PyTorch's thread count."""
    import torch  # a test-only dependency, needed by the MiniLM comparison alone
    import transformers

    ref = transformers.BertModel.from_pretrained(hj.minilm_l6_path()).eval()
    batch = {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}
    with torch.inference_mode():
        for _ in range(3):
            ref(**batch)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            for _ in range(calls):
                ref(**batch)
    ms: collections.Counter = collections.Counter()
    for event in profile.key_averages():
        ms[torch_category(event.key)] += event.self_cpu_time_total / 1e3 / calls
    return ms, torch.get_num_threads()


def report(title: str, ms: collections.Counter) -> None:
    total = sum(ms.values())
    print(f"{title}: {total:.1f} ms per call, by what it computes:")
    for name, t in ms.most_common():
        print(f"  {name:<54}{t:>9.1f} ms {100 * t / total:>6.1f}%")


def training_step(model: hj.Model, batch: dict[str, np.ndarray]) -> tuple:
    """A blocking call of `bench/train.py`'s step on `batch` (state carried), and its program."""
    made = step, state = step_and_state(model)
    compiled = step.single.lower(state, batch, jax.random.key(0)).compile()
    return our_step(model, batch, made), compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--model", choices=("minilm", "vit", "dinov2"), default="minilm")
    parser.add_argument("--step", action="store_true", help="the training step, not the forward")
    parser.add_argument("--dtype", choices=PRECISIONS, default="float32")
    args = parser.parse_args()
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    if args.step and args.model == "dinov2":
        parser.error("--step profiles the MiniLM or the study ViT")
    rng = np.random.default_rng(0)
    if args.model == "minilm":
        model = with_classifier(hj.from_pretrained(hj.minilm_l6_path()), 2, jax.random.key(0))
        batch, what = random_tokens(rng, 32, 64), "MiniLM-L6 forward, batch 32 x 64 tokens"
    elif args.model == "dinov2":
        with tempfile.TemporaryDirectory() as directory:
            dinov2_small(Path(directory))
            model = hj.from_pretrained(directory)
        pixels = rng.standard_normal((8, 3, 224, 224)).astype(np.float32)
        batch, what = {"pixel_values": pixels}, "DINOv2-S forward, 8 images of 224 px"
    else:
        model = hj.Model.init(artefacts.scratch_config(vit_fmnist.get_config()), jax.random.key(0))
        size, images = model.config.image_size, 64 if args.step else 256
        pixels = rng.standard_normal((images, model.config.num_channels, size, size))
        batch, what = {"pixel_values": pixels.astype(np.float32)}, f"ViT forward, {images} images"
    model = at_precision(model, args.dtype)
    if args.step:
        batch["labels"] = np.arange(len(next(iter(batch.values())))) % model.config.num_labels
        call, compiled = training_step(model, batch)
        what = what.replace("forward", "training step")
    else:
        output = "last_hidden_state" if args.model == "dinov2" else "logits"
        forward = jax.jit(lambda p, b: getattr(model.apply(p, **b), output))
        compiled = forward.lower(model.params, batch).compile()

        def call() -> None:
            jax.block_until_ready(forward(model.params, batch))

    ops = fused_ops(compiled.as_text())
    for _ in range(3):
        call()
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory):
            for _ in range(args.calls):
                call()
        trace = next(Path(directory).rglob("*.xplane.pb"))
        data = jax.profiler.ProfileData.from_file(str(trace))
    ms: collections.Counter = collections.Counter()  # per call
    fusions: collections.Counter = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                name = event.name
                if name in ops:  # an executed fusion (any thread)
                    ms[category(ops[name])] += event.duration_ns / 1e6 / args.calls
                    fusions[name] += event.duration_ns / 1e6 / args.calls
                elif re.fullmatch(r"[a-z_\-]+\.\d+", name) and not name.startswith("end"):
                    ms["unfused ops"] += event.duration_ns / 1e6 / args.calls
    report(f"{what}, CPU {args.dtype}, XLA ops (summed over threads)", ms)
    if args.step:
        print("costliest fusions (ms per call: what they compute):")
        for name, t in fusions.most_common(8):
            print(f"  {name:<32}{t:>8.2f}  {category(ops[name])}: {dict(ops[name].most_common(6))}")
    if args.model == "minilm" and not args.step and args.dtype == "float32":
        torch_ms, threads = torch_profile(batch, args.calls)
        report(f"{what}, CPU fp32, transformers (torch, {threads} threads) aten ops", torch_ms)


if __name__ == "__main__":
    main()
