"""One process of the 2-process check in tests/test_sharding.py.

    python tests/multiprocess_worker.py PROCESS_ID PORT OUT_DIR

Joins a 2-process JAX runtime on localhost (gloo collectives; this process's 4 CPU devices
come from JAX_NUM_CPU_DEVICES), builds the global data=4 x member=2 mesh over all 8 devices and
runs `test_sharding.run_all` under it: training (stopped after 2 steps and resumed; checkpoints
in OUT_DIR/run, shared), prediction (each process reading only its rows of every batch), head
scores and circuit search; then, on a heads=8 mesh
(each process holds half of every layer's heads), compacts the model. Process 0 writes the
results to OUT_DIR/results.npz. A failure prints its traceback and exits at once, without
waiting on the shutdown barrier.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path


def main(process_id: int, port: int, out: Path) -> None:
    import jax

    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id,
        initialization_timeout=60, heartbeat_timeout_seconds=10, shutdown_timeout_seconds=10,
    )  # fmt: skip
    jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    import numpy as np

    # Run as a script, this file's directory (tests/) is sys.path[0].
    from test_sharding import COMPACT_KEEP, run_all, scenario

    import hydra_jax as hj
    from hydra_jax.evaluation import predict
    from hydra_jax.heads import compact
    from hydra_jax.models.sharding import make_mesh, place_params, process_rows, to_host

    assert jax.process_count() == 2 and len(jax.devices()) == 8, jax.devices()
    try:  # a mesh that leaves process 1's devices out is refused, not half-run
        make_mesh(data=4)
        raise AssertionError("make_mesh(data=4) on 2 processes x 4 devices was accepted")
    except ValueError as error:
        assert "must span all of them" in str(error), error
    setup = scenario()
    with jax.set_mesh(make_mesh(data=4, member=2)):
        assert process_rows(8) == slice(4 * process_id, 4 * process_id + 4)  # its half only
        results = run_all(setup, out / "run", interrupted=True)
        # Prediction reads only this process's rows of each batch (its half of 8).
        test, asked = setup[2], []
        read = type(test).batch
        type(test).batch = lambda self, index, *a, **k: (
            asked.append(len(index)) or read(self, index, *a, **k)
        )
        predict(setup[1][0], test, 8, progress=False)
        type(test).batch = read
        assert asked and set(asked) == {4}, asked
    with jax.set_mesh(make_mesh(heads=8)):  # each process holds half of every layer's heads
        single = setup[0]
        placed = hj.Model(single.config, place_params(single.params))
        compacted = jax.tree.map(to_host, compact(placed, COMPACT_KEEP).params)
    if process_id == 0:
        flat = {f"predict/{k}": v for k, v in results["predict"].items()}
        flat |= {"his": results["scores"][0], "entropy": results["scores"][1]}
        flat |= {"circuit": results["circuit"]}
        flat |= {f"fit/{i}": x for i, x in enumerate(jax.tree.leaves(results["fit"]))}
        flat |= {f"compact/{i}": x for i, x in enumerate(jax.tree.leaves(compacted))}
        np.savez(out / "results.npz", **flat)
    jax.distributed.shutdown()


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
