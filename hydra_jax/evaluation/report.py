"""`report.md` and plots from `results.json`-shaped dicts and saved predictions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax import extras, metrics


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


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


def held_out_tables(methods: dict[str, Any], held_out: Sequence[str]) -> list[str]:
    """Seen vs held-out classes (`results["methods"][NAME]["zero_shot"]`), and
    misclassification detection."""
    held = ", ".join(held_out)
    lines = [
        "",
        f"## Zero-shot: seen classes vs held out ({held}; never in training)",
        "",
        "| method | seen acc % | seen NLL | seen ECE % | held-out acc % | held-out NLL "
        "| held-out ECE % |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in methods.items():
        s, h = r["zero_shot"]["seen"], r["zero_shot"]["held_out"]
        cells = [f"{100 * x['acc']:.2f} | {x['nll']:.4f} | {100 * x['ece']:.2f}" for x in (s, h)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "## Misclassification detection (MSP; wrong predictions are positive), ID test, %",
        "",
        "| method | AUROC | AUPR | FPR95 |",
        "|---|---|---|---|",
    ]
    for name, r in methods.items():
        m = r["zero_shot"]["misclassification"]
        lines.append(
            f"| {name} | {100 * m['auroc']:.2f} | {100 * m['aupr']:.2f} | {100 * m['fpr95']:.2f} |"
        )
    return lines


def id_table(methods: dict[str, Any]) -> list[str]:
    """ID accuracy, calibration and member diversity of each method (`results["methods"]`)."""
    lines = [
        "## In-distribution test set",
        "",
        "| method | acc % | NLL | Brier | ECE % | aECE % | MCE % | cwECE % | entropy | MI "
        "| disagreement |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in methods.items():
        m = r["id"]
        extra = [f"{m[k]:.4f}" if k in m else "-" for k in ("mutual_information", "disagreement")]
        cw = _pct(m["cwece"]) if "cwece" in m else "-"  # results of an older evaluation
        lines.append(
            f"| {name} | {_pct(m['acc'])} | {m['nll']:.4f} | {m['brier']:.4f} | {_pct(m['ece'])} "
            f"| {_pct(m['aece'])} | {_pct(m['mce'])} | {cw} | {m['entropy']:.4f} "
            f"| {' | '.join(extra)} |"
        )
    return lines


def calibration_table(methods: dict[str, Any]) -> list[str]:
    """Temperature scaling: the fitted temperature, and NLL and ECEs before and after it (ID
    test set; the shifted sets' mean ECE where the study has them)."""
    shifted = bool(next(iter(methods.values()))["calibration"]["shift"])
    lines = [
        "",
        "## Temperature scaling (one temperature per method, fitted by NLL on ID validation)",
        "",
        "Before -> after scaling, ID test set"
        + ("; shift: mean over the shifted sets." if shifted else "."),
        "",
        "| method | T | NLL | ECE % | aECE % | cwECE % | acc % |"
        + (" shift ECE % |" if shifted else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if shifted else ""),
    ]
    for name, r in methods.items():
        before, c = r["id"], r["calibration"]
        after = c["id"]
        cells = [f"{c['temperature']:.3f}", f"{before['nll']:.4f} -> {after['nll']:.4f}"]
        cells += [f"{_pct(before[k])} -> {_pct(after[k])}" for k in ("ece", "aece", "cwece")]
        cells.append(_pct(after["acc"]))
        if shifted:
            mean = lambda res: float(np.mean([v["ece"] for v in res.values()]))  # noqa: E731
            cells.append(f"{_pct(mean(r['shift']))} -> {_pct(mean(c['shift']))}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def selective_table(methods: dict[str, Any]) -> list[str]:
    """AURC, AUGRC and the selective risk at 80 / 90 / 95% coverage (member-mean confidence)."""
    lines = [
        "",
        "## Selective classification (member-mean confidence; ID test set), %",
        "",
        "| method | AURC | AUGRC | risk at 80% | risk at 90% | risk at 95% |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in methods.items():
        s = r["selective"]
        keys = ("aurc", "augrc", "risk_80", "risk_90", "risk_95")
        lines.append(f"| {name} | " + " | ".join(_pct(s[k]) for k in keys) + " |")
    return lines


def conformal_table(methods: dict[str, Any]) -> list[str]:
    """Coverage and mean set size of LAC, APS and RAPS on the ID test set (and APS's mean over
    the shifted sets)."""
    first = next(iter(methods.values()))["conformal"]
    shifts = [k for k in first["aps"] if k.startswith("shift_")]
    lines = [
        "",
        f"## Conformal prediction sets (split conformal on ID validation, alpha "
        f"{first['alpha']:g}): coverage % / mean set size",
        "",
        "| method | LAC | APS | RAPS |" + (" APS, shift mean |" if shifts else ""),
        "|---|---|---|---|" + ("---|" if shifts else ""),
    ]
    for name, r in methods.items():
        c = r["conformal"]
        cells = [
            f"{_pct(c[m]['test']['coverage'])} / {c[m]['test']['size']:.2f}"
            for m in ("lac", "aps", "raps")
        ]
        if shifts:
            coverage = np.mean([c["aps"][s]["coverage"] for s in shifts])
            size = np.mean([c["aps"][s]["size"] for s in shifts])
            cells.append(f"{_pct(coverage)} / {size:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def ood_tables(methods: dict[str, Any], scores: Sequence[str]) -> list[str]:
    """`ood_table`, then per score of `scores` the mean AUROC / FPR95 over all OOD sets and
    over each group's (near, far); feature detectors: the member mean of the score."""
    lines = ood_table(methods)
    if not lines:
        return lines
    first = next(iter(methods.values()))["ood"]
    means = [k for k in ("mean", "mean_near", "mean_far") if k in first]
    groups = {n: r.get("group") for n, r in first.items() if not n.startswith("mean")}
    for label in means:
        group = label.removeprefix("mean").strip("_")
        sets = [n for n, g in groups.items() if not group or g == group]
        lines += [
            "",
            f"## OOD detection by score, AUROC / FPR95 in %: mean over "
            f"{group + ' OOD sets' if group else 'all OOD sets'} ({', '.join(sets)})",
            "",
            "| method | " + " | ".join(scores) + " |",
            "|---|" + "---|" * len(scores),
        ]
        for name, r in methods.items():
            by = r["ood"][label]["by_score"]
            cells = [
                f"{_pct(by[s]['auroc'])} / {_pct(by[s]['fpr95'])}" if s in by else "-"
                for s in scores
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def ood_table(methods: dict[str, Any]) -> list[str]:
    """AUROC / AUPR / FPR95 (MSP score) of each method per OOD set (none: no lines)."""
    ood_sets = [s for s in next(iter(methods.values()))["ood"] if not s.startswith("mean")]
    if not ood_sets:  # a study may have none (calibration only)
        return []
    lines = [
        "",
        "## OOD detection (MSP score; OOD is the positive class), AUROC / AUPR / FPR95 in %",
        "",
        "| method | " + " | ".join([*ood_sets, "mean"]) + " |",
        "|---|" + "---|" * (len(ood_sets) + 1),
    ]
    for name, r in methods.items():
        cells = [
            f"{_pct(r['ood'][s]['auroc'])} / {_pct(r['ood'][s]['aupr'])} / "
            f"{_pct(r['ood'][s]['fpr95'])}"
            for s in [*ood_sets, "mean"]
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def cost_table(methods: dict[str, Any]) -> list[str]:
    """Parameters, XLA FLOPs per example and latency of each method."""
    lines = [
        "",
        "## Cost (CPU, fp32; latency of one batch, median)",
        "",
        "| method | params | GFLOPs / example | latency ms | examples / s |",
        "|---|---|---|---|---|",
    ]
    for name, r in methods.items():
        c = r["cost"]
        lines.append(
            f"| {name} | {c['params']:,} | {c['flops_per_example'] / 1e9:.4g} | "
            f"{c['latency_ms']:.1f} | {c['examples_per_s']:.1f} |"
        )
    return lines


def shift_tables(methods: dict[str, Any]) -> list[str]:
    """Accuracy, NLL and ECE of each method on the shifted ID test sets (none: no lines)."""
    shifts = list(next(iter(methods.values())).get("shift", {}))
    if not shifts:
        return []
    lines = ["", "## Dataset shift (the ID test set corrupted; CORRUPTION_SEVERITY)"]
    for key, label, fmt in (
        ("acc", "accuracy %", _pct),
        ("nll", "NLL", "{:.4f}".format),
        ("ece", "ECE %", _pct),
    ):
        lines += ["", f"{label}:", "", "| method | " + " | ".join([*shifts, "mean"]) + " |"]
        lines += ["|---|" + "---|" * (len(shifts) + 1)]
        for name, r in methods.items():
            values = [r["shift"][s][key] for s in shifts]
            cells = [fmt(v) for v in [*values, float(np.mean(values))]]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
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
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
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
    ax.legend(fontsize="small")
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
