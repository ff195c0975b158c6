"""What the gradient all-reduce of a data-parallel step costs across 2 CPU processes (gloo).

    python -m bench.collectives            # launches 2 local processes x 1 CPU device each

A data-parallel training step sums its gradients across processes. XLA combines them into one
all-reduce of a tuple (one array per parameter); this times that all-reduce of a tiny BERT's
gradient tree against the same numbers in one flat array, interleaved, in both processes. On
CPU the ratio shows how much of a 2-process training step is per-array collective latency.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bench.timing import interleaved, medians
from hydra_jax.models import BertConfig, EncoderConfig, Model

PROCESSES = 2


def gradient_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of a 2-layer BERT classifier (hidden 64, 4 heads of 16)."""
    encoder = EncoderConfig((4, 4), 64, 16, 256, "gelu", 1e-12, pre_norm=False)
    config = BertConfig(encoder, vocab_size=100, max_positions=64, type_vocab_size=2, num_labels=2)
    params = jax.eval_shape(lambda: Model.init(config, jax.random.key(0)).params)
    return [x.shape for x in jax.tree.leaves(params)]


def worker(process_id: int, port: int, repeats: int) -> None:
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=PROCESSES, process_id=process_id,
        initialization_timeout=60, heartbeat_timeout_seconds=10, shutdown_timeout_seconds=10,
    )  # fmt: skip
    devices = len(jax.devices())
    rows = NamedSharding(jax.make_mesh((devices,), ("data",)), P("data"))

    def partial_sums(shape: tuple[int, ...]) -> jax.Array:
        """`[devices, *shape]`, one row per device: summing the rows is an all-reduce."""
        return jax.make_array_from_callback(
            (devices, *shape), rows, lambda index: np.ones((1, *shape), np.float32)
        )

    shapes = gradient_shapes()
    tree = [partial_sums(s) for s in shapes]
    flat = partial_sums((sum(int(np.prod(s)) for s in shapes),))
    per_array = jax.jit(lambda xs: [x.sum(0) for x in xs])
    one_buffer = jax.jit(lambda x: x.sum(0))
    programs = {  # the same seeded order in both processes, so their collectives pair up
        f"{len(shapes)} arrays": lambda: jax.block_until_ready(per_array(tree)),
        "one flat array": lambda: jax.block_until_ready(one_buffer(flat)),
    }
    times = medians(interleaved(programs, repeats=repeats))
    if process_id == 0:
        print(f"{PROCESSES} processes x {jax.local_device_count()} CPU device(s), "
              f"{sum(int(np.prod(s)) for s in shapes):,} floats")  # fmt: skip
        for name, seconds in times.items():
            print(f"  {name:>16}: {seconds * 1e3:7.2f} ms")
        ratio = times[f"{len(shapes)} arrays"] / times["one flat array"]
        print(f"  ratio {ratio:.1f}x: {ratio / len(shapes):.2f} of a flat all-reduce per array")
    jax.distributed.shutdown()


def launch(repeats: int) -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    command = [sys.executable, "-m", "bench.collectives", "--port", str(port), "--repeats",
               str(repeats), "--process_id"]  # fmt: skip
    procs = [subprocess.Popen([*command, str(i)], env=env) for i in range(PROCESSES)]
    try:
        return max(p.wait(timeout=600) for p in procs)
    finally:
        for p in procs:
            p.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--process_id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_id is None:
        return launch(args.repeats)
    worker(args.process_id, args.port, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
