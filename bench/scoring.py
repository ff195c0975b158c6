"""HIS + attention-entropy scoring over the calibration set vs one forward pass over it.

The scoring side is the public `scoring.his_and_entropy` (one compiled forward+backward per
batch, per-example gradients summed on the host), as the pruning and Hydra stages call it.

MiniLM-L6 (real weights, random classifier), 32 calibration sentences (the HIES default), CPU
fp32, interleaved medians; target (SPEC section 10): scoring <= 3.5 x one forward.

    .venv/bin/python -m bench.scoring [--repeats 20] [--examples 32] [--tokens 64]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import hydra_jax as hj
from bench.timing import interleaved, medians
from hydra_jax.data import random_tokens
from hydra_jax.heads import scoring
from hydra_jax.models import with_classifier


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    model = with_classifier(hj.from_pretrained(hj.minilm_l6_path()), 2, jax.random.key(0))
    rng = np.random.default_rng(0)
    batch = random_tokens(rng, args.examples, args.tokens)
    batch["labels"] = rng.integers(0, 2, args.examples)
    forward = jax.jit(lambda p, b: model.apply(p, **b).logits)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    programs = {
        "HIS + AE (vmap(grad))": lambda: scoring.his_and_entropy(model, [batch]),
        "one forward": lambda: jax.block_until_ready(forward(model.params, inputs)),
    }
    times = medians(interleaved(programs, repeats=args.repeats))
    print(f"MiniLM-L6, {args.examples} x {args.tokens} tokens, CPU fp32, "
          f"{args.repeats} interleaved rounds")  # fmt: skip
    for name, t in times.items():
        print(f"{name:<24}{t * 1e3:>10.1f} ms")
    ratio = times["HIS + AE (vmap(grad))"] / times["one forward"]
    print(f"ratio scoring / forward: {ratio:.2f} (target <= 3.5)")
    return ratio


if __name__ == "__main__":
    main()
