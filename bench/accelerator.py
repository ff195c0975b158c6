"""The paper's cost claim on a GPU or TPU, run as is: single, fused Hydra (M = 3 members keeping 4
of 12 heads per layer) and Deep Ensemble, bf16 compute, batch 256, at ViT-B/16 (224 x 224
images) and BERT-base (128 tokens) shapes with random weights; latency medians over interleaved
rounds and the Hydra / single ratio (the paper: 1.07 in bf16 on a GPU; SPEC target <= 1.10).

    python -m bench.accelerator                      # on the accelerator JAX finds
    python -m bench.accelerator --tiny --repeats 2   # tiny shapes: what the test suite runs

It prints the device, each program's median, and the ratios.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from bench.precision import PRECISIONS, measure, report
from hydra_jax.data import random_tokens
from hydra_jax.models import BertConfig, EncoderConfig, Model, ViTConfig


def encoder(layers: int, heads: int, head_dim: int, mlp_dim: int, pre_norm: bool) -> EncoderConfig:
    eps = 1e-12
    return EncoderConfig((heads,) * layers, heads * head_dim, head_dim, mlp_dim, "gelu", eps,
                         pre_norm)  # fmt: skip


def shapes(tiny: bool) -> dict[str, tuple]:
    """`{name: (config, batch)}`: ViT-B/16 and BERT-base, or tiny stand-ins with 12 heads."""
    if tiny:
        vit = ViTConfig(encoder(2, 12, 2, 32, True), image_size=8, patch_size=4, num_labels=10)
        bert = BertConfig(encoder(2, 12, 2, 32, False), 100, 16, 2, num_labels=2)
        return {"ViT (tiny)": (vit, 4, 8), "BERT (tiny)": (bert, 4, 16)}
    vit = ViTConfig(encoder(12, 12, 64, 3072, True), image_size=224, patch_size=16,
                    num_labels=1000)  # fmt: skip
    bert = BertConfig(encoder(12, 12, 64, 3072, False), 30522, 512, 2, num_labels=2)
    return {"ViT-B/16": (vit, 256, 224), "BERT-base": (bert, 256, 128)}


def batch_for(config: ViTConfig | BertConfig, size: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if isinstance(config, ViTConfig):
        images = rng.normal(size=(size, config.num_channels, length, length))
        return {"pixel_values": images.astype(np.float32)}
    batch = random_tokens(rng, size, length)  # ids in [1000, 30000): BERT's word pieces
    return batch | {"input_ids": batch["input_ids"] % config.vocab_size}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the test suite)")
    parser.add_argument("--dtype", default="bfloat16", choices=PRECISIONS)
    args = parser.parse_args(argv)
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()})")
    results = {}
    for name, (config, size, length) in shapes(args.tiny).items():
        members = [Model.init(config, jax.random.key(m)) for m in range(3)]
        batch = batch_for(config, size, length)
        times, _ = measure(members[0], members, batch, (args.dtype,), repeats=args.repeats)
        report(f"{name}, batch {size}, {args.dtype}, {args.repeats} interleaved rounds", times,
               (args.dtype,))  # fmt: skip
        results[name] = times
    return results


if __name__ == "__main__":
    main()
