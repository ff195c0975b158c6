"""Launching N processes of one JAX run on localhost (the multi-process tests)."""

from __future__ import annotations

import os
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_processes(
    command: list[str], processes: int = 2, devices: int = 4, timeout: float = 300, **popen
) -> list[str]:
    """Runs `command + [port, process id]`-formatted copies, one per process, and waits for all.

    `command` may hold `{port}` and `{process_id}`; each process sees `devices` CPU devices.
    A coordinator port taken meanwhile (the coordinator segfaults) is retried once on another.

    Returns:
      Each process's combined output.

    Raises:
      AssertionError: a process failed or timed out (with every process's output tail).
    """
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices)}
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):  # can hang the init
        env.pop(k, None)
    for _ in range(2):
        port = free_port()
        procs = [
            subprocess.Popen([a.format(port=port, process_id=i) for a in command],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             **popen)
            for i in range(processes)
        ]  # fmt: skip
        outputs = ["(timed out)"] * processes
        try:
            outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
        codes = [p.returncode for p in procs]
        if codes == [0] * processes:
            return outputs
        if -11 not in codes:
            break
    raise AssertionError(f"processes exited {codes}:\n" + "\n".join(o[-3000:] for o in outputs))
