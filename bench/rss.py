"""Peak resident memory of a command: `python -m bench.rss CMD ARG...` runs CMD, waits for it,
and prints `{"peak_rss_gb": ..., "wall_s": ..., "returncode": ...}` as its last line.

A child's `ru_maxrss` counts the memory of the process it was forked from (Linux keeps the
high-water mark across `exec`), so a benchmark that has loaded JAX cannot read its children's
peaks itself: it runs them through this small process, which imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> None:
    start = time.perf_counter()
    process = subprocess.Popen(sys.argv[1:])
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    measured = {
        "peak_rss_gb": usage.ru_maxrss / 2**20,  # kilobytes on Linux
        "wall_s": time.perf_counter() - start,
        "returncode": process.returncode,
    }
    print(json.dumps(measured), flush=True)


if __name__ == "__main__":
    main()
