"""A study's plots, drawn from what its workdir keeps (`predictions/NAME.npz`, `results.json`),
so a finished workdir can be drawn again (`replot`, `hydra-jax plot WORKDIR`):

- per method: its reliability diagram, risk-coverage curves, MSP score histograms, and the ROC
  and precision-recall curves of each OOD set (`plots/{reliability,risk_coverage,ood_scores,
  ood_curves}_NAME.png`);
- per study: every method's uncertainty against its cost (`plots/cost_uncertainty.png`).

`section` shows them in `report.md`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.evaluation import report
from hydra_jax.evaluation.seeds import load_results
from hydra_jax.experiments.evaluators.base import Predictions
from hydra_jax.experiments.evaluators.ood import ood_scores
from hydra_jax.metrics import selective

COST_PLOT = "cost_uncertainty.png"


def method_plots(name: str, predictions: Predictions, directory: Path) -> None:
    """Method `name`'s plots, from its predictions."""
    test = predictions.id
    report.reliability_plot(
        directory / f"reliability_{name}.png", test.probs, test.labels,
        f"{name}: reliability (ID test)",
    )  # fmt: skip
    p = test.probs.astype(np.float64).mean(1)
    report.risk_coverage_plot(
        directory / f"risk_coverage_{name}.png",
        selective.risk_coverage(p.max(-1), p.argmax(-1) == test.labels),
        f"{name}: risk-coverage (ID test)",
    )
    id_msp = metrics.ood_score(test.probs, "msp")
    msp = {s: metrics.ood_score(o.probs, "msp") for s, o in predictions.ood.items()}
    report.ood_histogram(
        directory / f"ood_scores_{name}.png", id_msp, msp, f"{name}: MSP scores",
        num_classes=test.probs.shape[-1],
    )  # fmt: skip
    if msp:
        report.ood_curves_plot(directory / f"ood_curves_{name}.png", id_msp, msp, f"{name}, MSP")


def study_plots(methods: dict[str, Any], scores: tuple[str, ...], directory: Path) -> None:
    """The study's plots from `results.json`'s `methods` (`scores`: the OOD scores it ran)."""
    if any("cost" in r for r in methods.values()):
        report.cost_plot(directory / COST_PLOT, methods, scores)


def section(methods: dict[str, Any]) -> list[str]:
    """`report.md`'s plots: the cost plot, then each method's reliability diagram and OOD
    curves."""
    lines = ["", "## Plots", ""]
    if any("cost" in r for r in methods.values()):
        lines += [f"![uncertainty against cost](plots/{COST_PLOT})", ""]
    for name, r in methods.items():
        lines.append(f"![{name}: reliability](plots/reliability_{name}.png)")
        if any(not k.startswith("mean") for k in r.get("ood", {})):
            lines.append(f"![{name}: OOD curves](plots/ood_curves_{name}.png)")
        lines.append("")
    return lines


def replot(workdir: Path) -> list[Path]:
    """Every plot of an evaluated workdir, drawn again from `results.json` and `predictions/`;
    returns the plots the workdir then holds.

    Raises:
      FileNotFoundError: `workdir` holds no `results.json` (evaluate it first).
    """
    workdir = Path(workdir)
    (results,) = load_results([workdir])
    directory = workdir / "plots"
    directory.mkdir(exist_ok=True)
    for name in results.get("methods", {}):
        arrays = workdir / "predictions" / f"{name}.npz"
        if arrays.is_file():
            with np.load(arrays) as npz:
                method_plots(name, Predictions.from_arrays(dict(npz)), directory)
    config = ml_collections.ConfigDict(results.get("config", {}))
    study_plots(results.get("methods", {}), tuple(ood_scores(config)), directory)
    return sorted(directory.glob("*.png"))


def main(argv: list[str]) -> int:
    """`hydra-jax plot WORKDIR`: every plot of an evaluated workdir drawn again."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: hydra-jax plot WORKDIR", file=sys.stderr)
        return 2
    try:
        written = replot(Path(argv[0]))
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(written)} plots in {Path(argv[0]) / 'plots'}")
    return 0
