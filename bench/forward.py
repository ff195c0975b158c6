"""Our jit-compiled MiniLM-L6 forward vs the `transformers` PyTorch forward of the same checkpoint.

CPU, fp32, batch 32 x 64 tokens, interleaved runs; prints medians, the ratio (target: ours <= 1.0x
PyTorch, SPEC section 10), XLA's FLOP count and the achieved GFLOP/s.

    .venv/bin/python -m bench.forward [--repeats 30]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import torch
import transformers

import hydra_jax as hj
from bench.timing import interleaved, medians
from hydra_jax.evaluation import xla_flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    path = hj.minilm_l6_path()
    ours = hj.from_pretrained(path)
    ref = transformers.BertModel.from_pretrained(path).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (args.batch, args.tokens)).astype(np.int32)
    mask = np.ones_like(ids)
    batch = dict(input_ids=ids, attention_mask=mask)
    torch_batch = {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}

    forward = jax.jit(lambda p, b: ours.apply(p, **b).last_hidden_state)
    compiled = forward.lower(ours.params, batch).compile()
    flops = xla_flops(compiled)

    def run_ours() -> None:
        jax.block_until_ready(compiled(ours.params, batch))

    def run_torch() -> None:
        with torch.inference_mode():
            ref(**torch_batch)

    with torch.inference_mode():
        expected = ref(**torch_batch).last_hidden_state.numpy()
    diff = np.abs(np.asarray(compiled(ours.params, batch)) - expected).max()

    programs = {"hydra_jax (jit)": run_ours, "transformers (torch)": run_torch}
    times = medians(interleaved(programs, repeats=args.repeats))
    ours_s, torch_s = times["hydra_jax (jit)"], times["transformers (torch)"]
    print(
        f"MiniLM-L6 forward, batch {args.batch} x {args.tokens} tokens, CPU fp32, "
        f"{args.repeats} interleaved rounds; torch threads {torch.get_num_threads()}"
    )
    print(f"max |ours - torch| on last_hidden_state: {diff:.2e}")
    print(f"{'program':<24}{'median ms':>12}")
    for name, t in times.items():
        print(f"{name:<24}{t * 1e3:>12.2f}")
    print(f"ratio ours / torch: {ours_s / torch_s:.3f}  (target <= 1.0)")
    print(
        f"XLA FLOPs per batch: {flops / 1e9:.2f} GFLOP; achieved {flops / ours_s / 1e9:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
