"""Two methods compared over training seeds, for every metric (`hydra-jax compare`).

    hydra-jax compare runs/demo runs/demo_seed1 runs/demo_seed2 --a hydra_circuit \\
        --b deep_ensemble --csv compare.csv --latex compare.tex

Each workdir is one training seed of one study, evaluated (`results.json`, `predictions/`).
Every metric is a numeric entry of a method's `results.json`, named by its path
(`id.ece`, `ood.tweets.by_score.mahalanobis.auroc`, `conformal.lac.test.coverage`): its mean
and standard deviation over the seeds for each method, the difference of the means, and a
paired bootstrap interval of that difference. Each resample redraws every seed's test
examples with replacement (the ID test set, then each OOD set by name: for the mean OOD AUROC
exactly `metrics.pooled_auroc_difference`'s draws; each shifted set by name from a stream of
its own, so a study's shifted sets leave those draws as they are), the same draw for both
methods, recomputes every evaluator of the study's config from the saved predictions, and
averages the seeds' differences: the interval covers test-set sampling given these seeds. What
the evaluators fit (temperature and conformal thresholds on the validation subset, feature
detectors on the training subset) is refitted on the same, undrawn data. The cost (parameters,
FLOPs, latency) gets mean and std only.

A metric has a direction where one is better: higher for accuracy, AUROC and AUPR, lower for
NLL, the calibration errors, Brier, FPR95, AURC, AUGRC, selective risk and set size. For
those, A wins where the whole interval favours it, loses where it favours B, and draws
otherwise.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from hydra_jax.evaluation.seeds import load_results
from hydra_jax.experiments.evaluators import registry
from hydra_jax.experiments.evaluators.base import Outputs, Predictions, Sets
from hydra_jax.experiments.evaluators.ood import ood_groups

HIGHER = frozenset({"acc", "auroc", "aupr", "aupr_in"})
LOWER = frozenset({"nll", "ece", "aece", "mce", "brier", "classwise_ece", "fpr95", "aurc",
                   "augrc", "size"})  # fmt: skip
COLUMNS = ("metric", "a_mean", "a_std", "b_mean", "b_std", "diff", "diff_low", "diff_high",
           "better", "verdict")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Row:
    """One metric: each method's mean and std over seeds, `diff` = `a_mean - b_mean` with its
    interval (NaN where it has none), which way is better, and the verdict for A (`win`,
    `draw`, `loss`; empty without a direction or an interval)."""

    metric: str
    a_mean: float
    a_std: float
    b_mean: float
    b_std: float
    diff: float
    diff_low: float
    diff_high: float
    better: str
    verdict: str


def numbers(tree: Any, prefix: str = "") -> dict[str, float]:
    """Every numeric leaf of a results entry by its dotted path (lists and flags left out)."""
    if isinstance(tree, dict):
        out: dict[str, float] = {}
        for key, value in tree.items():
            out |= numbers(value, f"{prefix}{key}.")
        return out
    if isinstance(tree, (int, float)) and not isinstance(tree, bool) and math.isfinite(tree):
        return {prefix[:-1]: float(tree)}
    return {}


def direction(metric: str) -> str:
    """ "higher", "lower" or "" (no better side: a count, a temperature, coverage)."""
    leaf = metric.rsplit(".", 1)[-1]
    if leaf in HIGHER:
        return "higher"
    if leaf in LOWER or leaf.startswith("risk"):
        return "lower"
    return ""


@dataclasses.dataclass(frozen=True)
class Seed:
    """One workdir: both methods' recorded results and saved predictions, and the study's
    evaluators (but the cost, which needs the model)."""

    workdir: Path
    results: tuple[dict[str, Any], dict[str, Any]]
    predictions: tuple[Predictions, Predictions]
    evaluators: tuple[Any, ...]


def load(workdir: Path, a: str, b: str) -> Seed:
    """Raises:
    FileNotFoundError: no `results.json`, or no saved predictions of a method.
    ValueError: a method the run did not evaluate, or methods predicted on different sets.
    """
    (results,) = load_results([workdir])
    missing = [m for m in (a, b) if m not in results["methods"]]
    if missing:
        raise ValueError(
            f"{workdir} evaluated no {missing}; it has {', '.join(results['methods'])}"
        )
    predictions = []
    for method in (a, b):
        arrays = Path(workdir) / "predictions" / f"{method}.npz"
        if not arrays.is_file():
            raise FileNotFoundError(f"{arrays} not found: evaluate {workdir} first")
        with np.load(arrays) as npz:
            predictions.append(Predictions.from_arrays(dict(npz)))
    first, second = predictions
    if (sorted(first.ood), sorted(first.shift)) != (sorted(second.ood), sorted(second.shift)):
        raise ValueError(f"{workdir}: {a} and {b} were evaluated on different sets")
    config = ml_collections.ConfigDict(results["config"])
    sets = Sets(
        test=None,  # type: ignore[arg-type]  (the builders read the sets' names only)
        ood=dict.fromkeys(first.ood),  # type: ignore[arg-type]
        shift=dict.fromkeys(first.shift),  # type: ignore[arg-type]
        validation=first.validation,  # type: ignore[arg-type]
        train=first.train,  # type: ignore[arg-type]
        groups=ood_groups(config, list(first.ood)),
    )
    evaluators = tuple(registry.study(config, sets, leave_out=("cost",)))
    return Seed(
        Path(workdir),
        (results["methods"][a], results["methods"][b]),
        (first, second),
        evaluators,
    )


def _drawn(outputs: Outputs, rows: np.ndarray) -> Outputs:
    def take(x: np.ndarray | None) -> np.ndarray | None:
        return None if x is None else x[rows]

    return Outputs(outputs.logits[rows], outputs.probs[rows], take(outputs.labels),
                   take(outputs.features))  # fmt: skip


def resampled(predictions: Predictions, draw: dict[str, np.ndarray]) -> Predictions:
    """`predictions` with the test sets' examples drawn (`draw`: rows per `id`, `ood:NAME`,
    `shift:NAME`); validation and training subsets as they are."""
    return dataclasses.replace(
        predictions,
        id=_drawn(predictions.id, draw["id"]),
        ood={n: _drawn(o, draw[f"ood:{n}"]) for n, o in predictions.ood.items()},
        shift={n: _drawn(o, draw[f"shift:{n}"]) for n, o in predictions.shift.items()},
    )


def _scored(seed: Seed, predictions: Predictions) -> dict[str, float]:
    return numbers({e.key: e(predictions, None) for e in seed.evaluators})


def compare(
    workdirs: Sequence[Path],
    a: str,
    b: str,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    only: Sequence[str] = (),
) -> list[Row]:
    """Every metric both methods have in every workdir, as `Row`s in `results.json` order; with
    `only`, the metrics under those paths (`("ood.mean.auroc",)`), whose evaluators alone are
    run."""
    if not workdirs:
        raise ValueError("no workdirs to compare")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples must be >= 1 and level in (0, 1): {resamples}, {level}")
    seeds = [load(w, a, b) for w in workdirs]
    if only:
        seeds = [dataclasses.replace(s, evaluators=_only(s.evaluators, only)) for s in seeds]
    recorded = [(numbers(s.results[0]), numbers(s.results[1])) for s in seeds]
    names = [k for k in recorded[0][0] if all(k in ra and k in rb for ra, rb in recorded)]
    summaries = [_mean_std([r[i] for r in recorded], names) for i in (0, 1)]
    if only:
        names = [k for k in names if any(k == p or k.startswith(f"{p}.") for p in only)]
    # ID and OOD draws in `metrics.pooled_auroc_difference`'s order from its generator; the
    # shifted sets' from another.
    rng, shift_rng = np.random.default_rng(seed), np.random.default_rng((seed, 1))
    draws: list[dict[str, float]] = []
    for _ in range(resamples):
        per_seed = []
        for s in seeds:
            pa = s.predictions[0]
            draw = {"id": rng.integers(0, len(pa.id.probs), len(pa.id.probs))}
            for kind, sets, generator in (("ood", pa.ood, rng), ("shift", pa.shift, shift_rng)):
                for n in sorted(sets):
                    size = len(sets[n].probs)
                    draw[f"{kind}:{n}"] = generator.integers(0, size, size)
            first, second = (_scored(s, resampled(p, draw)) for p in s.predictions)
            per_seed.append({k: first[k] - second[k] for k in first if k in second})
        draws.append({k: float(np.mean([d[k] for d in per_seed])) for k in per_seed[0]})
    rows = []
    for name in names:
        (a_mean, a_std), (b_mean, b_std) = summaries[0][name], summaries[1][name]
        diff = a_mean - b_mean
        sampled = [d[name] for d in draws if name in d]
        low, high = (
            np.percentile(sampled, [50 * (1 - level), 50 * (1 + level)])
            if sampled
            else (math.nan, math.nan)
        )
        better = direction(name)
        verdict = ""
        if better and sampled:
            favours_a = low > 0 if better == "higher" else high < 0
            favours_b = high < 0 if better == "higher" else low > 0
            verdict = "win" if favours_a else "loss" if favours_b else "draw"
        rows.append(Row(name, a_mean, a_std, b_mean, b_std, diff, float(low), float(high),
                        better, verdict))  # fmt: skip
    return rows


def _mean_std(runs: list[dict[str, float]], names: list[str]) -> dict[str, tuple[float, float]]:
    """Each metric's mean and standard deviation over runs (ddof 1; 0 for one run)."""
    out = {}
    for name in names:
        values = np.array([run[name] for run in runs])
        out[name] = (float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0)
    return out


def mean_std(results: Sequence[dict[str, Any]], method: str) -> dict[str, tuple[float, float]]:
    """Every metric of one method over the `results.json` of training seeds (`load_results`):
    its mean and standard deviation, as `compare` gives them (those every seed has)."""
    runs = [numbers(r["methods"][method]) for r in results]
    names = [k for k in runs[0] if all(k in run for run in runs)]
    return _mean_std(runs, names)


def _only(evaluators: tuple[Any, ...], paths: Sequence[str]) -> tuple[Any, ...]:
    """The evaluators that give the metrics under `paths`; the OOD evaluator with MSP alone
    where no path asks for another score (`by_score`): the rest is not recomputed."""
    keys = {path.split(".")[0] for path in paths}
    kept = []
    for e in evaluators:
        if e.key not in keys:
            continue
        if e.key == "ood" and not any("by_score" in path for path in paths):
            e = dataclasses.replace(e, scores=("msp",))
        kept.append(e)
    return tuple(kept)


def tally(rows: Sequence[Row]) -> dict[str, int]:
    """A's wins, draws and losses over the metrics with a direction."""
    return {v: sum(r.verdict == v for r in rows) for v in ("win", "draw", "loss")}


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([getattr(row, c) for c in COLUMNS])


def _tex(text: str) -> str:
    return text.replace("\\", "\\textbackslash{}").replace("_", "\\_").replace("%", "\\%")


def latex(rows: Sequence[Row], a: str, b: str, seeds: int, level: float = 0.95) -> str:
    """A booktabs table: each method's mean $\\pm$ std over seeds, and the difference with its
    paired bootstrap interval."""
    lines = [
        "\\begin{tabular}{lrrr}",
        "\\toprule",
        f"metric & {_tex(a)} & {_tex(b)} & {_tex(a)} $-$ {_tex(b)} "
        f"[{round(100 * level)}\\% interval] \\\\",
        "\\midrule",
    ]
    for r in rows:
        interval = "" if math.isnan(r.diff_low) else f" [{r.diff_low:+.4f}, {r.diff_high:+.4f}]"
        lines.append(
            f"{_tex(r.metric)} & {r.a_mean:.4f} $\\pm$ {r.a_std:.4f} & "
            f"{r.b_mean:.4f} $\\pm$ {r.b_std:.4f} & {r.diff:+.4f}{interval} \\\\"
        )
    lines += ["\\bottomrule", "\\end{tabular}", f"% {seeds} training seeds; mean $\\pm$ std"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    """`hydra-jax compare WORKDIR... --a METHOD --b METHOD [--csv F] [--latex F]`: wins, draws
    and losses on stdout; every metric's row in the files."""
    parser = argparse.ArgumentParser(prog="hydra-jax compare", description=main.__doc__)
    parser.add_argument("workdirs", nargs="+", type=Path, help="evaluated workdirs, one a seed")
    parser.add_argument("--a", required=True, help="method A")
    parser.add_argument("--b", required=True, help="method B")
    parser.add_argument("--csv", type=Path, default=None, help="write every metric's row here")
    parser.add_argument("--latex", type=Path, default=None, help="a booktabs table here")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--level", type=float, default=0.95, help="the interval's level")
    args = parser.parse_args(argv)
    try:
        rows = compare(args.workdirs, args.a, args.b, args.resamples, args.level)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = tally(rows)
    print(
        f"{args.a} vs {args.b} over {len(args.workdirs)} seeds, {len(rows)} metrics: "
        f"{counts['win']} wins, {counts['draw']} draws, {counts['loss']} losses "
        f"({round(100 * args.level)}% paired bootstrap intervals, {args.resamples} resamples)"
    )
    if args.csv:
        write_csv(rows, args.csv)
    if args.latex:
        args.latex.write_text(latex(rows, args.a, args.b, len(args.workdirs), args.level))
    return 0
