"""A study over training seeds: mean +- std of each method's headline metrics across evaluated
workdirs (one per study seed), as a Markdown summary with the differences `hydra-jax compare`
gives (`seeds.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# (label, path into a method's results, scale): the columns of the seed table.
HEADLINE = (
    ("acc %", ("id", "acc"), 100),
    ("NLL", ("id", "nll"), 1),
    ("ECE %", ("id", "ece"), 100),
    ("OOD AUROC %", ("ood", "mean", "auroc"), 100),
    ("OOD FPR95 %", ("ood", "mean", "fpr95"), 100),
)
SHIFT = (("shift acc %", "acc", 100), ("shift NLL", "nll", 1), ("shift ECE %", "ece", 100))
# Zero-shot studies add the held-out classes and misclassification detection.
ZERO_SHOT = (
    ("seen acc %", ("seen", "acc"), 100),
    ("held-out acc %", ("held_out", "acc"), 100),
    ("misclass. AUROC %", ("misclassification", "auroc"), 100),
)


def load_results(workdirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Each workdir's `results.json` (written by evaluate.py)."""
    out = []
    for workdir in workdirs:
        path = Path(workdir) / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run evaluate.py on {workdir} first")
        out.append(json.loads(path.read_text()))
    return out


def headline(result: dict[str, Any]) -> dict[str, float]:
    """One method's headline numbers; under shift, the mean over every corruption and severity."""
    row = {}
    for label, path, scale in HEADLINE:
        value: Any = result
        for key in path:
            value = value[key]
        row[label] = scale * value
    for label, key, scale in SHIFT if "shift" in result else ():
        row[label] = scale * float(np.mean([s[key] for s in result["shift"].values()]))
    for label, (part, key), scale in ZERO_SHOT if "zero_shot" in result else ():
        row[label] = scale * result["zero_shot"][part][key]
    return row


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """`{method: {metric: (mean, std)}}` over runs (std with ddof=1; 0 for one run), for the
    methods every run evaluated, in the first run's order."""
    methods = [m for m in results[0]["methods"] if all(m in r["methods"] for r in results)]
    out = {}
    for method in methods:
        rows = [headline(r["methods"][method]) for r in results]
        out[method] = {
            k: (
                float(np.mean([row[k] for row in rows])),
                float(np.std([row[k] for row in rows], ddof=1)) if len(rows) > 1 else 0.0,
            )
            for k in rows[0]
        }
    return out


def markdown(
    title: str,
    workdirs: Sequence[Path],
    summary: dict[str, dict[str, tuple[float, float]]],
    differences: dict[tuple[str, str], dict[str, float]],
) -> str:
    columns = list(next(iter(summary.values())))
    lines = [f"# {title}", "", f"{len(workdirs)} study seeds: " + ", ".join(map(str, workdirs))]
    lines += [
        "",
        "Mean +- std over seeds (OOD: MSP score, mean over the OOD sets; shift: mean "
        "over every corruption and severity).",
        "",
    ]
    lines += ["| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for method, row in summary.items():
        cells = [
            f"{mean:.2f} +- {std:.2f}" if "NLL" not in k else f"{mean:.4f} +- {std:.4f}"
            for k, (mean, std) in row.items()
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if differences:
        lines += [
            "",
            "Mean OOD AUROC differences, paired bootstrap 95% intervals pooled over "
            "seeds (test examples redrawn within each seed):",
            "",
        ]
        lines += ["| a - b | points | 95% interval |", "|---|---|---|"]
        for (a, b), d in differences.items():
            lines.append(
                f"| {a} - {b} | {100 * d['difference']:+.2f} | "
                f"[{100 * d['low']:+.2f}, {100 * d['high']:+.2f}] |"
            )
    return "\n".join(lines) + "\n"
