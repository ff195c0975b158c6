"""`report.md` and plots from `results.json`-shaped dicts and saved predictions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax import extras, metrics


def markdown(
    title: str, sections: list[list[str]], stages: dict[str, float], predictions: bool = True
) -> str:
    """`report.md`: the title, each section (lines), the wall time per stage and, where methods
    saved their `predictions`, how to recompute the metrics."""
    lines = [f"# {title}", ""]
    for section in sections:
        lines += section
    if stages:
        lines += ["", "## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
        lines += [f"| {k} | {v:.1f} |" for k, v in stages.items()]
    if predictions:
        lines += [
            "",
            "Metrics are recomputable from `predictions/NAME.npz` with `hydra_jax.metrics`.",
        ]
    return "\n".join([*lines, ""])


def skipped_images_section(skipped: dict[str, list[str]], shown: int = 10) -> list[str]:
    """The images left out of each source because they do not decode (`data.skip_bad_images`):
    their count and the first `shown` names."""
    lines = ["", "## Images left out", "", "Images that do not decode, left out of the study:", ""]
    lines += ["| source | images | first of them |", "|---|---|---|"]
    for spec, names in skipped.items():
        first = ", ".join(f"`{name}`" for name in names[:shown])
        lines.append(f"| `{spec}` | {len(names)} | {first}{' ...' if len(names) > shown else ''} |")
    return lines


def pyplot():
    """matplotlib's pyplot (Agg backend), imported on first use: `import hydra_jax` does not."""
    extras.studies_import("matplotlib", "plots").use("Agg")
    return extras.studies_import("matplotlib.pyplot", "plots")


def reliability_plot(path: Path, probs: np.ndarray, labels: np.ndarray, title: str) -> None:
    plt = pyplot()
    p = probs.mean(1) if probs.ndim == 3 else probs
    confidence = p.max(-1)
    correct = (p.argmax(-1) == labels).astype(float)
    r = metrics.reliability(confidence, correct)
    centres = (r["edges"][:-1] + r["edges"][1:]) / 2
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.bar(
        centres,
        np.nan_to_num(r["accuracy"]),
        width=1 / len(centres),
        edgecolor="k",
        alpha=0.7,
        label="accuracy",
    )
    ax.plot([0, 1], [0, 1], "r--", label="perfect calibration")
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1), title=title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def risk_coverage_plot(path: Path, curve: dict[str, np.ndarray], title: str) -> None:
    """The selective risk and the generalised risk against coverage (`selective.risk_coverage`)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(curve["coverage"], curve["risk"], label="selective risk")
    ax.plot(curve["coverage"], curve["generalised"], "--", label="generalised risk")
    ax.set(xlabel="coverage", ylabel="risk", xlim=(0, 1), ylim=(0, None), title=title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ood_histogram(
    path: Path, id_scores: np.ndarray, ood_scores: dict, title: str, num_classes: int = 2
) -> None:
    """Histograms of MSP scores (-max p, in [-1, -1/C]) of the ID and each OOD test set."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bins = np.linspace(-1, -1 / num_classes, 26)
    ax.hist(id_scores, bins=bins, density=True, alpha=0.5, label="ID test")
    for name, scores in ood_scores.items():
        ax.hist(scores, bins=bins, density=True, histtype="step", linewidth=1.5, label=name)
    ax.set(xlabel="MSP score (-max p), higher = more OOD", ylabel="density", title=title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")  # beside the bars
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ood_curves_plot(path: Path, id_scores: np.ndarray, ood_scores: dict, title: str) -> None:
    """ROC and precision-recall curves (OOD positive) of each OOD set against the ID test set."""
    plt = pyplot()
    fig, (roc, pr) = plt.subplots(1, 2, figsize=(8, 3.5))
    for name, scores in ood_scores.items():
        curve = metrics.ood_curves(id_scores, scores)
        auroc = metrics.ood(id_scores, scores)
        roc.plot(curve["fpr"], curve["tpr"], label=f"{name} ({100 * auroc['auroc']:.1f})")
        pr.step(curve["recall"], curve["precision"], where="post",
                label=f"{name} ({100 * auroc['aupr']:.1f})")  # fmt: skip
    roc.plot([0, 1], [0, 1], "k:", linewidth=0.8)
    roc.set(xlabel="false positive rate (ID flagged)", ylabel="true positive rate",
            title=f"{title}: ROC (AUROC %)")  # fmt: skip
    pr.set(xlabel="recall (OOD)", ylabel="precision", ylim=(0, 1.02),
           title=f"{title}: PR (AUPR %)")  # fmt: skip
    # Fixed places: matplotlib's "best" searches every point of every curve (seconds on a
    # large test set).
    roc.legend(loc="lower right", fontsize="small")
    pr.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# The y axes of the cost plot: (label, path into a method's results, scale).
UNCERTAINTY = (
    ("mean OOD AUROC %", ("ood", "mean", "auroc"), 100),
    ("ECE %", ("id", "ece"), 100),
    ("AURC", ("selective", "aurc"), 1),
)


def cost_plot(path: Path, methods: dict, scores: tuple[str, ...] = ("msp",)) -> None:
    """Each method's uncertainty against its cost: mean OOD AUROC (one marker per score of
    `scores`), ECE and AURC on the y axes, XLA FLOPs per example (top) and measured latency
    (bottom) on the x axes, from `results.json`'s `methods` (those with a cost)."""
    plt = pyplot()
    costed = {n: r for n, r in methods.items() if "cost" in r}
    fig, axes = plt.subplots(2, len(UNCERTAINTY), figsize=(4 * len(UNCERTAINTY), 7))
    markers = "os^vD<>px*hH8dP"
    for row, (xlabel, key, scale) in enumerate(
        (("GFLOP / example", "flops_per_example", 1e-9), ("latency ms / batch", "latency_ms", 1))
    ):
        for column, (ylabel, where, yscale) in enumerate(UNCERTAINTY):
            ax = axes[row, column]
            for i, r in enumerate(costed.values()):
                x, color = r["cost"][key] * scale, f"C{i % 10}"
                if where[0] == "ood":
                    by = r.get("ood", {}).get("mean", {}).get("by_score", {})
                    for k, score in enumerate(s for s in scores if s in by):
                        ax.scatter(x, yscale * by[score]["auroc"], marker=markers[k % len(markers)],
                                   color=color)  # fmt: skip
                    continue
                value: Any = r
                for part in where:
                    value = value.get(part, {}) if isinstance(value, dict) else {}
                if isinstance(value, (int, float)):
                    ax.scatter(x, yscale * value, color=color)
            ax.set(xlabel=xlabel, ylabel=ylabel)
    for i, name in enumerate(costed):
        axes[0, 0].scatter([], [], color=f"C{i % 10}", label=name)
    for k, score in enumerate(scores):
        marker = markers[k % len(markers)]
        axes[0, 0].scatter([], [], marker=marker, color="grey", label=f"AUROC: {score}")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize="small")  # fmt: skip
    fig.suptitle("uncertainty against cost (ID test; OOD: mean over the OOD sets)")
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def training_logs(workdir: Path) -> dict[str, Path]:
    """Every training log (`metrics.jsonl`) under `workdir`, named by its run's directory."""
    logs = sorted(Path(workdir).rglob("metrics.jsonl"))
    return {str(p.parent.relative_to(workdir)): p for p in logs}


def loss_curves(path: Path, logs: dict[str, Path], title: str) -> None:
    """The logged training loss of each run against its step."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, log in logs.items():
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        ax.plot([r["step"] for r in records], [r["loss"] for r in records], label=name)
    ax.set(xlabel="step", ylabel="training loss", title=title)
    ax.legend(loc="upper right", fontsize="small")  # losses fall: the corner they leave
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def training_section(logs: dict[str, Path], plot: str) -> str:
    """The report's training section: where the logs are, and the loss curves' plot."""
    runs = ", ".join(f"`{name}`" for name in logs)
    return (
        "\n## Training loss\n\n"
        f"Logged every `log_every` steps in each run's `metrics.jsonl` and TensorBoard event files "
        f"(`tensorboard/`): {runs}.\n\n![training loss]({plot})\n"
    )
