"""Our attention layer vs the token-major formulation it replaced, forward and gradient.

The library's `Attention` transposes q, k, v to head-major `[B, N, T, K]` and scales q; the
earlier code contracted token-major `[B, T, N, K]` operands in both einsums and scaled the
`[B, N, T, S]` scores. Same parameters, same inputs (MiniLM-L6 shapes with a padding bias: 32 x
64 tokens, 12 heads of 32; the Fashion-MNIST ViT's: 256 x 50 tokens, 12 heads of 6), CPU fp32,
interleaved rounds; prints medians and the ratio per program. The gradient is of a sum of
squares of the layer's output with respect to its parameters.

    .venv/bin/python -m bench.attention [--repeats 30]
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench.timing import interleaved, medians
from hydra_jax.models.attention import Attention

OURS, BEFORE = "head-major (ours)", "token-major (before)"
SHAPES = {"MiniLM-L6": (32, 64, 12, 32, True), "ViT (Fashion-MNIST)": (256, 50, 12, 6, False)}


def token_major(params: Any, x: jax.Array, bias: jax.Array | None, K: int) -> jax.Array:
    """The formulation before the head-major layout: `[B, T, N, K]` einsums, scaled scores."""

    def project(name: str) -> jax.Array:  # [B, T, N, K]
        p = params[name]
        return jnp.einsum("BTD,DNK->BTNK", x, p["kernel"]) + p["bias"][None, None]

    q, k, v = project("query"), project("key"), project("value")
    logits = jnp.einsum("BTNK,BSNK->BNTS", q, k) / jnp.sqrt(K).astype(q.dtype)
    probs = jax.nn.softmax(logits if bias is None else logits + bias, axis=-1)  # [B, N, T, S]
    context = jnp.einsum("BNTS,BSNK->BTNK", probs, v)
    out = params["out"]
    return jnp.einsum("BTNK,NKD->BTD", context, out["kernel"]) + out["bias"][None, None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    programs, checks = {}, {}
    for name, (B, T, N, K, padded) in SHAPES.items():
        layer = Attention(N, K, N * K)
        x = jnp.asarray(rng.standard_normal((B, T, N * K)), jnp.float32)
        bias = jnp.zeros((B, 1, T, T), jnp.float32) if padded else None
        params = layer.init(jax.random.key(0), x, bias, None)["params"]
        variants = {
            OURS: lambda p, x, b=bias, m=layer: m.apply({"params": p}, x, b, None)[0],
            BEFORE: lambda p, x, b=bias, K=K: token_major(p, x, b, K),
        }
        for variant, f in variants.items():
            loss = lambda p, x, f=f: jnp.sum(f(p, x) ** 2)  # noqa: E731
            compiled = {
                kind: jax.jit(fn).lower(params, x).compile()
                for kind, fn in (("forward", f), ("gradient", jax.grad(loss)))
            }
            for kind, c in compiled.items():
                programs[(name, kind, variant)] = lambda c=c, p=params, x=x: jax.block_until_ready(
                    c(p, x)
                )
            checks[(name, variant)] = np.asarray(compiled["forward"](params, x))
        diff = np.abs(checks[(name, OURS)] - checks[(name, BEFORE)])
        print(f"{name}: max |head-major - token-major| on the output: {diff.max():.2e}")
    keys = list(programs)
    times = medians(interleaved({str(i): programs[k] for i, k in enumerate(keys)}, args.repeats))
    ms = {k: 1e3 * times[str(i)] for i, k in enumerate(keys)}
    print(f"one attention layer, CPU fp32, {args.repeats} interleaved rounds, median ms")
    print(f"{'shape':<22}{'program':<11}{'head-major':>12}{'token-major':>13}{'ratio':>8}")
    for name in SHAPES:
        for kind in ("forward", "gradient"):
            ours, before = ms[(name, kind, OURS)], ms[(name, kind, BEFORE)]
            print(f"{name:<22}{kind:<11}{ours:>12.2f}{before:>13.2f}{ours / before:>8.3f}")


if __name__ == "__main__":
    main()
