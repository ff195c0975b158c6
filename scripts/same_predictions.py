"""Compares the saved predictions of two evaluated workdirs, array by array.

    python scripts/same_predictions.py RUN_A RUN_B [--atol 1e-6]

Every `predictions/*.npz` of RUN_A must exist in RUN_B with the same keys and shapes and values
within `atol` (0 asks for bit equality); pruning and ablation workdirs compare `results.json`
curves and rows, and head sets; a pair with nothing to compare is an error, not "same". Used to
check that a refactoring, or a run on several processes, changed no result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def compare_npz(a: Path, b: Path, atol: float, compared: list[str]) -> list[str]:
    problems = []
    for path in sorted((a / "predictions").glob("*.npz")):
        other = b / "predictions" / path.name
        if not other.is_file():
            problems.append(f"{other} is missing")
            continue
        with np.load(path) as x, np.load(other) as y:
            if sorted(x) != sorted(y):
                problems.append(f"{path.name}: keys {sorted(x)} vs {sorted(y)}")
                continue
            for key in x:
                if x[key].shape != y[key].shape:
                    problems.append(f"{path.name}[{key}]: shape {x[key].shape} vs {y[key].shape}")
                    continue
                diff = float(np.max(np.abs(x[key].astype(np.float64) - y[key]), initial=0.0))
                compared.append(f"{path.name}[{key}]")
                status = "equal" if diff == 0 else f"max |diff| {diff:.3g}"
                print(f"{path.name}[{key}]: {status}")
                if diff > atol:
                    problems.append(f"{path.name}[{key}]: max |diff| {diff:.3g} > {atol}")
    return problems


def compare_json(
    a: Path, b: Path, name: str, keys: list[str], atol: float, compared: list[str]
) -> list[str]:
    if not (a / name).is_file():
        return []
    if not (b / name).is_file():
        return [f"{b / name} is missing"]
    x, y = json.loads((a / name).read_text()), json.loads((b / name).read_text())
    problems = []
    for key in keys:
        if key not in x:
            continue
        left, right = _numbers(x[key]), _numbers(y.get(key))
        if len(left) != len(right):
            problems.append(f"{name}[{key}]: different structure")
            continue
        diff = max((abs(p - q) for p, q in zip(left, right, strict=True)), default=0.0)
        compared.append(f"{name}[{key}]")
        print(f"{name}[{key}]: {'equal' if diff == 0 else f'max |diff| {diff:.3g}'}")
        if diff > atol:
            problems.append(f"{name}[{key}]: max |diff| {diff:.3g} > {atol}")
    return problems


# The head sets a workdir saved: per Hydra strategy, and per ablation row (`M{M}_{strategy}`;
# runs before the study engine kept those in head_sets.json too).
HEAD_SET_FILES = ("head_sets.json", "ablation_head_sets.json")


def _head_sets(run: Path) -> dict[str, list]:
    sets: dict[str, list] = {}
    for name in HEAD_SET_FILES:
        if (run / name).is_file():
            sets |= json.loads((run / name).read_text())
    return sets


def compare_head_sets(a: Path, b: Path, compared: list[str]) -> list[str]:
    """Every head set of `a` must be in `b`, equal."""
    left, right = _head_sets(a), _head_sets(b)
    problems = []
    for key, sets in left.items():
        compared.append(f"head sets[{key}]")
        if key not in right:
            problems.append(f"head sets[{key}]: missing in {b}")
            continue
        equal = sets == right[key]
        print(f"head sets[{key}]: {'equal' if equal else 'different'}")
        if not equal:
            problems.append(f"head sets[{key}]: different")
    return problems


def _numbers(tree) -> list[float]:
    if isinstance(tree, dict):
        return [v for k in sorted(tree) if k not in ("stages", "fpr95") for v in _numbers(tree[k])]
    if isinstance(tree, list | tuple):
        return [v for item in tree for v in _numbers(item)]
    return [float(tree)] if isinstance(tree, int | float) else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args(argv)
    compared: list[str] = []
    problems = compare_npz(args.a, args.b, args.atol, compared)
    results = ["curves", "hies_alpha", "scores", "rows"]
    problems += compare_json(args.a, args.b, "results.json", results, args.atol, compared)
    problems += compare_head_sets(args.a, args.b, compared)
    if not compared:
        problems.append(f"nothing to compare in {args.a}: no predictions, curves, rows, head sets")
    for problem in problems:
        print("DIFFERENT:", problem)
    print("same" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
