"""Our attention layer vs the three formulations it replaced, forward and gradient.

The library's `Attention` transposes q, k, v to head-major `[B, N, T, K]`, scales q, and
normalises the softmax after the value product (dividing `[B, N, T, K]` contexts, not
`[B, N, T, S]` scores), attending the queries in blocks of at most 256 rows. `one_block` is the
same with every row in one block (as before the blocks; the same program up to 256 tokens).
Before it, `head_major_normalised` divided the scores first (as `jax.nn.softmax` does), and
before that `token_major` contracted `[B, T, N, K]` operands in both einsums and scaled the
`[B, N, T, S]` scores. Same parameters, same inputs (MiniLM-L6 shapes with a padding bias: 32 x
64 tokens, 12 heads of 32; the Fashion-MNIST ViT's: 256 x 50 tokens, 12 heads of 6; DINOv2-S's
at 224 px: 8 x 257 tokens, 6 heads of 64), CPU fp32, interleaved rounds; prints medians and our
ratio to each. The gradient is of a sum of squares of the layer's output with respect to its
parameters.

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

OURS, ONE_BLOCK = "ours", "one block"
NORMALISED, TOKEN_MAJOR = "normalised first", "token-major"
VARIANTS = (OURS, ONE_BLOCK, NORMALISED, TOKEN_MAJOR)
SHAPES = {"MiniLM-L6": (32, 64, 12, 32, True), "ViT (Fashion-MNIST)": (256, 50, 12, 6, False),
          "DINOv2-S (224 px)": (8, 257, 6, 64, False)}  # fmt: skip


def _project(params: Any, x: jax.Array, name: str) -> jax.Array:  # [B, T, N, K]
    p = params[name]
    return jnp.einsum("BTD,DNK->BTNK", x, p["kernel"]) + p["bias"][None, None]


def _output(params: Any, context: jax.Array) -> jax.Array:  # [B, T, N, K] -> [B, T, D]
    out = params["out"]
    return jnp.einsum("BTNK,NKD->BTD", context, out["kernel"]) + out["bias"][None, None]


def one_block(params: Any, x: jax.Array, bias: jax.Array | None, K: int) -> jax.Array:
    """Ours with all T query rows attended at once."""
    q, k, v = (_project(params, x, n).transpose(0, 2, 1, 3) for n in ("query", "key", "value"))
    logits = jnp.einsum("BNTK,BNSK->BNTS", q / jnp.sqrt(K).astype(q.dtype), k)
    logits = logits if bias is None else logits + bias
    unnormalised = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
    context = jnp.einsum("BNTS,BNSK->BNTK", unnormalised, v)
    return _output(params, (context / unnormalised.sum(-1, keepdims=True)).transpose(0, 2, 1, 3))


def head_major_normalised(params: Any, x: jax.Array, bias: jax.Array | None, K: int) -> jax.Array:
    """Head-major operands and a scaled q, with the softmax normalised before the value product."""
    q, k, v = (_project(params, x, n).transpose(0, 2, 1, 3) for n in ("query", "key", "value"))
    logits = jnp.einsum("BNTK,BNSK->BNTS", q / jnp.sqrt(K).astype(q.dtype), k)
    probs = jax.nn.softmax(logits if bias is None else logits + bias, axis=-1)  # [B, N, T, S]
    return _output(params, jnp.einsum("BNTS,BNSK->BNTK", probs, v).transpose(0, 2, 1, 3))


def token_major(params: Any, x: jax.Array, bias: jax.Array | None, K: int) -> jax.Array:
    """The first formulation: `[B, T, N, K]` einsums, scaled scores, normalised before."""
    q, k, v = (_project(params, x, name) for name in ("query", "key", "value"))
    logits = jnp.einsum("BTNK,BSNK->BNTS", q, k) / jnp.sqrt(K).astype(q.dtype)
    probs = jax.nn.softmax(logits if bias is None else logits + bias, axis=-1)  # [B, N, T, S]
    return _output(params, jnp.einsum("BNTS,BSNK->BTNK", probs, v))


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
            ONE_BLOCK: lambda p, x, b=bias, K=K: one_block(p, x, b, K),
            NORMALISED: lambda p, x, b=bias, K=K: head_major_normalised(p, x, b, K),
            TOKEN_MAJOR: lambda p, x, b=bias, K=K: token_major(p, x, b, K),
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
        for other in VARIANTS[1:]:
            diff = np.abs(checks[(name, OURS)] - checks[(name, other)]).max()
            print(f"{name}: max |ours - {other}| on the output: {diff:.2e}")
    keys = list(programs)
    times = medians(interleaved({str(i): programs[k] for i, k in enumerate(keys)}, args.repeats))
    ms = {k: 1e3 * times[str(i)] for i, k in enumerate(keys)}
    print(f"one attention layer, CPU fp32, {args.repeats} interleaved rounds, median ms")
    print(f"{'shape':<22}{'program':<10}" + "".join(f"{v:>18}" for v in VARIANTS)
          + f"{'/ one block':>13}{'/ normalised':>14}{'/ token-major':>15}")  # fmt: skip
    for name in SHAPES:
        for kind in ("forward", "gradient"):
            row = [ms[(name, kind, variant)] for variant in VARIANTS]
            print(f"{name:<22}{kind:<10}" + "".join(f"{t:>18.2f}" for t in row)
                  + f"{row[0] / row[1]:>13.3f}{row[0] / row[2]:>14.3f}"
                  + f"{row[0] / row[3]:>15.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
