"""A `hydra-jax plan --json` result as a table of the docs' data (`docs/data/benchmarks.json`).

    python scripts/plan_table.py PLAN.json TABLE --cpu "2-core Intel Xeon ..." --source "..."

Adds (or replaces) TABLE: one row per method and program (per-chip GFLOP, GB moved, argument
and temporary GB, whether they fit the chip's memory, the roofline time, the work split), and
the rows "hydra / single" and "hydra / deep_ensemble" of each program (FLOPs and roofline
ratios). `python scripts/tables.py` then writes it into the pages.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "docs" / "data" / "benchmarks.json"
COLUMNS = [
    {"name": "method", "header": "method"},
    {"name": "program", "header": "program"},
    {"name": "gflop", "header": "GFLOP / chip", "fmt": ",.1f"},
    {"name": "moved", "header": "GB moved / chip", "fmt": ",.2f"},
    {"name": "arguments", "header": "arguments GB", "fmt": ".2f"},
    {"name": "temporaries", "header": "temporaries GB", "fmt": ".2f"},
    {"name": "fits", "header": "fits HBM"},
    {"name": "roofline", "header": "roofline ms", "fmt": ",.2f"},
    {"name": "split", "header": "work split", "fmt": ".2f"},
]


def rows(result: dict) -> list[dict]:
    out, by = [], {}
    for r in result["rows"]:
        by[(r["method"], r["program"])] = r
        out.append({
            "method": r["method"], "program": r["program"],
            "gflop": r["flops_per_device"] / 1e9, "moved": r["bytes_per_device"] / 1e9,
            "arguments": r["argument_bytes"] / 1e9, "temporaries": r["temp_bytes"] / 1e9,
            "fits": "-" if r["fits"] is None else ("yes" if r["fits"] else "no"),
            "roofline": r["roofline_ms"], "split": r["work_split"],
        })  # fmt: skip
    for other in ("single", "deep_ensemble"):
        for program in ("predict", "train_step"):
            a, b = by.get(("hydra", program)), by.get((other, program))
            if a is None or b is None:
                continue
            roofline = None if a["roofline_ms"] is None else a["roofline_ms"] / b["roofline_ms"]
            out.append({
                "method": f"hydra / {other}", "program": program,
                "gflop": a["flops_per_device"] / b["flops_per_device"],
                "moved": a["bytes_per_device"] / b["bytes_per_device"],
                "arguments": None, "temporaries": None, "fits": "", "roofline": roofline,
                "split": None,
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("table")
    parser.add_argument("--cpu", required=True)
    parser.add_argument("--source", required=True)
    args = parser.parse_args()
    result = json.loads(Path(args.plan).read_text())
    from tables import dump  # scripts/ is on the path of a script run as written

    tables = json.loads(DATA.read_text())
    tables[args.table] = {
        "cpu": args.cpu,
        "date": datetime.date.today().isoformat(),
        "source": args.source,
        "columns": [c | {"null": "-"} for c in COLUMNS],
        "rows": rows(result),
    }
    DATA.write_text(dump(tables))


if __name__ == "__main__":
    main()
