"""The attention core's value and gradient: XLA's products (the models' formulation) against the
native kernels (`hydra_jax/native`), by head width; where `MAX_HEAD_DIM` comes from. The kernels
compile widths up to 8 each as a constant; wider heads run their loops over a variable width.

For each shape `[B, N, T, K]` (queries, keys and values alike; the study ViT's 64 x 12 heads of
width 6 on 50 tokens first), both programs differentiate the same sum of the context times a
fixed cotangent with respect to q, k and v, jitted apart and interleaved in one process
(`bench/timing.py`); prints medians, the native / XLA ratio and the largest gradient difference
relative to the largest gradient.

    .venv/bin/python -m bench.native [--repeats 20]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bench.timing import interleaved, medians
from hydra_jax.models.attention import Attention
from hydra_jax.native import attention as native

SHAPES = (
    (64, 12, 50, 6),  # the study ViT (configs/vit_fmnist.py), batch 64
    (64, 12, 50, 8),
    (64, 12, 50, 16),
    (32, 12, 64, 32),  # MiniLM-L6's heads, 32 x 64 tokens, no padding
    (8, 6, 257, 64),  # DINOv2-S at 224 px
)


def xla(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The models' attention core (`Attention._attend`, no logit terms, no dropout)."""
    return Attention._attend(q, k, v, [], lambda x: x)[0]


def programs(shape: tuple[int, ...]) -> tuple[dict, float]:
    """Blocking calls of both value-and-gradient programs, and their largest gradient difference
    over the largest gradient."""
    rng = np.random.default_rng(0)
    q, k, v, g = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
    made = {
        "xla": xla,
        "native": lambda q, k, v: native.attend(xla, q, k, v),
    }
    calls, grads = {}, {}
    for name, f in made.items():
        step = jax.jit(jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v) * g), argnums=(0, 1, 2)))
        compiled = step.lower(q, k, v).compile()
        grads[name] = compiled(q, k, v)
        calls[name] = lambda compiled=compiled: jax.block_until_ready(compiled(q, k, v))
    scale = max(float(jnp.abs(x).max()) for x in grads["xla"])
    difference = max(
        float(jnp.abs(a - b).max()) for a, b in zip(grads["xla"], grads["native"], strict=True)
    )
    return calls, difference / scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    x = jnp.zeros((1, 1, 1, 1), jnp.float32)
    if not native.applies(x, x, x):
        raise SystemExit("the native kernels are not available here (see the warning above)")
    print(f"attention core value and gradient, CPU fp32, {args.repeats} interleaved calls")
    print(f"{'[B, N, T, K]':<20}{'XLA ms':>9}{'native ms':>11}{'ratio':>8}  grad diff / max")
    for shape in SHAPES:
        calls, difference = programs(shape)
        t = medians(interleaved(calls, repeats=args.repeats))
        print(
            f"{list(shape)!s:<20}{1e3 * t['xla']:>9.2f}{1e3 * t['native']:>11.2f}"
            f"{t['native'] / t['xla']:>8.3f}  {difference:.1e}"
        )


if __name__ == "__main__":
    main()
