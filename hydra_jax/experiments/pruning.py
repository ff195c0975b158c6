"""The `pruning_curves` analysis: one-shot head pruning of member 0 by each criterion.

For every ratio in `pruning_curves.ratios` and criterion in `pruning_curves.criteria` (random
over several seeds, l2, his, ad, hies), heads are removed by global top-k with no fine-tuning,
and the pruned model is scored on the ID test set (accuracy, stability, ECE, NLL) and the OOD
test sets, if the study has any (MSP AUROC). HIES's alpha is chosen per ratio on the ID
validation split from `pruning_curves.alphas`. `train` scores the heads and chooses the alphas
(`scores.npz`, `hies_alpha.json`); `evaluate` draws the curves from them. Member 0 is a
study's own or that of `base_workdir`, on its data: the embedded sets, or your files (whose run
then needs `data.validation`). Stability is OUR definition (the HIES paper gives none): the
percentage of test examples whose predicted class equals the unpruned model's.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from tqdm.auto import tqdm

from hydra_jax import checks
from hydra_jax.data import Dataset, labelled_batches, subset
from hydra_jax.evaluation import Method, predict
from hydra_jax.evaluation.report import pyplot
from hydra_jax.experiments import evaluators
from hydra_jax.experiments.analyses import Context
from hydra_jax.heads import hies, his_and_entropy, keep_mask, score
from hydra_jax.models import Model

CRITERIA = ("random", "l2", "his", "ad", "hies")  # ad: attention entropy, low = important
CURVE_METRICS = ("acc", "stability", "ece", "nll", "ood_auroc")
SCORES_FILE = "scores.npz"  # every criterion's head scores [L, N], and the attention entropy
ALPHAS_FILE = "hies_alpha.json"  # HIES's alpha per ratio, chosen on validation accuracy


def default_config(smoke: bool = False) -> ml_collections.ConfigDict:
    """The analysis's settings: criteria random (3 seeds), l2, his, ad, hies; 0..70% of the heads
    removed; HIES alpha chosen per ratio from {0, 0.1, ..., 0.9}. `smoke` shrinks them to 3
    ratios, 2 random seeds and 2 alphas."""
    settings = dict(
        ratios=tuple(round(0.1 * i, 1) for i in range(8)),
        criteria=CRITERIA,
        random_seeds=(0, 1, 2),
        alphas=tuple(round(0.1 * i, 1) for i in range(10)),
    )
    if smoke:
        settings.update(ratios=(0.0, 0.3, 0.6), random_seeds=(0, 1), alphas=(0.0, 0.5))
    return ml_collections.ConfigDict(settings)


class MaskedPredictor:
    """Logits `[N, C]` of one model under any head mask, through the one prediction loop (one
    compiled program per padded shape: the mask is an input, not a constant)."""

    def __init__(self, model: Model, batch_size: int):
        self.model, self.batch_size = model, batch_size

        def forward(weights: Any, batch: dict) -> Any:
            params, mask = weights
            return model.apply(params, **batch, head_mask=mask).logits[:, None]  # [B, 1, C]

        self._forward = forward

    def method(self, mask: np.ndarray) -> Method:
        """The model under `mask` as a method (its forward compiled once for every mask)."""
        return Method("masked", self._forward, (self.model.params, np.asarray(mask, np.float32)))

    def __call__(self, mask: np.ndarray, dataset: Dataset) -> np.ndarray:
        return predict(self.method(mask), dataset, self.batch_size, progress=False)[:, 0]


def curve_point(
    predict: MaskedPredictor,
    mask: np.ndarray,
    test: Dataset,
    ood: dict[str, Dataset],
    reference: np.ndarray,
) -> dict[str, Any]:
    """The metrics of one pruned model, from the study's prediction loop and evaluators (ID
    classification, OOD detection by MSP); `reference` is the unpruned model's test
    predictions. Without OOD sets (`ood` empty) the point has no OOD AUROC."""
    method = predict.method(mask)
    sets = evaluators.Sets(test, ood)
    predictions = evaluators.predictions_of(method, sets, predict.batch_size, progress=False)
    scoring = [evaluators.Classification(), evaluators.OODDetection(tuple(ood), ("msp",))]
    result = evaluators.score(scoring, predictions, method)
    classification, auroc = result["id"], {name: result["ood"][name]["auroc"] for name in ood}
    probs = predictions.id.probs[:, 0]
    point = {
        "acc": classification["acc"],
        "stability": float(np.mean(probs.argmax(-1) == reference)),
        "ece": classification["ece"],
        "nll": classification["nll"],
    }
    if ood:
        point |= {"ood_auroc": float(np.mean(list(auroc.values()))), "ood_auroc_per_set": auroc}
    return point | {"heads_kept": int(mask.sum())}


def measured(point: dict[str, Any]) -> list[str]:
    """The keys of `CURVE_METRICS` a curve point holds (no OOD AUROC without OOD sets)."""
    return [k for k in CURVE_METRICS if k in point]


def curve_metrics(curves: dict[str, dict[str, Any]]) -> list[str]:
    """The metrics of every point of `curves` (`measured` of the first: all hold the same)."""
    return measured(next(iter(next(iter(curves.values())).values())))


def check(context: Context) -> None:
    """Refuses settings the curves cannot use (named by key) and a study without ID validation
    data (HIES's alpha is chosen on it)."""
    settings = context.config.pruning_curves
    for key in ("ratios", "criteria", "alphas"):
        if not settings[key]:
            raise ValueError(f"pruning_curves.{key} is empty")
    unknown = sorted(set(settings.criteria) - set(CRITERIA))
    if unknown:
        raise ValueError(
            f"pruning_curves.criteria: unknown {unknown}; known: {', '.join(CRITERIA)}"
        )
    for key, one_included in (("ratios", False), ("alphas", True)):
        bad = _not_fractions(settings[key], one_included)
        if bad:
            interval = "[0, 1]" if one_included else "[0, 1)"
            raise ValueError(f"pruning_curves.{key} must lie in {interval}, got {bad}")
    if "random" in settings.criteria:
        if not settings.random_seeds:
            raise ValueError("pruning_curves.random_seeds is empty (criterion random)")
        for seed in settings.random_seeds:
            checks.count("pruning_curves.random_seeds", seed, minimum=0)
    if context.data.id_validation() is None:
        raise ValueError(
            f"HIES's alpha is chosen on validation data, but the run in "
            f"{context.plan.workdir} has none (data.validation)"
        )


def _not_fractions(values: Any, one_included: bool) -> list:
    """The `values` that are not numbers in [0, 1) (or [0, 1] if `one_included`)."""

    def fraction(v: Any) -> bool:
        number = isinstance(v, int | float) and not isinstance(v, bool)
        return number and (0 <= v < 1 or (one_included and v == 1))

    return [v for v in values if not fraction(v)]


def train(context: Context) -> None:
    """Scores member 0's heads by every criterion and chooses HIES's alpha per ratio on the ID
    validation split; writes `scores.npz` and `hies_alpha.json`. Prunes no model (the curves
    prune one-shot, in `evaluate`)."""
    config, workdir, model = context.config, context.workdir, context.single
    settings = config.pruning_curves
    validation = context.data.id_validation()
    calibration = labelled_batches(
        context.data.study.train,
        config.calibration_size,
        config.calibration_seed,
        config.calibration_size,
    )
    with workdir.stage("scores (HIS + AE + l2)"):
        his, entropy = his_and_entropy(model, calibration)
        scores = {"his": his, "entropy": entropy, "l2": score(model, method="l2")}
        for seed in settings.random_seeds:
            scores[f"random_{seed}"] = score(model, method="random", seed=seed)
    with workdir.stage("alpha selection (validation)"):
        predict = MaskedPredictor(model, config.eval.batch_size)
        alphas = {}
        for ratio in settings.ratios:
            accuracy = {}
            for alpha in settings.alphas:
                keep = keep_mask(hies(his, entropy, alpha), ratio=ratio)
                accuracy[alpha] = float(
                    np.mean(predict(keep, validation).argmax(-1) == validation.labels)
                )
            alphas[str(ratio)] = max(settings.alphas, key=lambda a: (accuracy[a], -a))
    workdir.write_arrays(workdir / SCORES_FILE, scores)
    workdir.write_json(ALPHAS_FILE, alphas)


def evaluate(context: Context) -> tuple[dict[str, Any], list[str]]:
    """Every pruning curve from the scores `train` wrote (and plots/); returns the results
    (`curves`, `hies_alpha`, `scores`) and the report section."""
    config, workdir, model = context.config, context.workdir, context.single
    settings = config.pruning_curves
    workdir.require(workdir / SCORES_FILE, "head scores")
    limit = config.data.ood_limit
    ood = {name: subset(s, limit) if limit else s for name, s in context.data.study.ood.items()}
    with np.load(workdir / SCORES_FILE) as saved:
        scores = dict(saved)
    alphas = workdir.read_json(ALPHAS_FILE)
    his, entropy = scores["his"], scores["entropy"]
    predict = MaskedPredictor(model, config.eval.batch_size)
    L, N = his.shape
    test = context.data.study.test
    reference = predict(np.ones((L, N), np.float32), test).argmax(-1)

    curves: dict[str, dict[str, Any]] = {}
    jobs = [(c, r) for c in settings.criteria for r in settings.ratios]
    with workdir.stage("pruning curves"):
        for criterion, ratio in tqdm(jobs, desc="pruning curves"):
            seeds = settings.random_seeds
            names = [f"random_{s}" for s in seeds] if criterion == "random" else [criterion]
            points = []
            for name in names:
                if name == "hies":
                    s = hies(his, entropy, alphas[str(ratio)])
                else:
                    s = 1 - entropy if name == "ad" else scores[name]
                keep = keep_mask(s, ratio=ratio)
                points.append(curve_point(predict, keep, test, ood, reference))
            curves.setdefault(criterion, {})[str(ratio)] = _mean_points(points)

    results = {
        "curves": curves,
        "hies_alpha": alphas,
        "scores": {k: v.tolist() for k, v in {**scores, "ad": 1 - entropy}.items()},
        "stability_definition": "ours: % of ID test examples predicted as the unpruned model does",
    }
    workdir.write_plots(functools.partial(_plot_curves, settings=settings, curves=curves))
    workdir.write_plots(
        functools.partial(
            _plot_scores,
            scores={
                "HIS": his,
                "AE (entropy)": entropy,
                "L2": scores["l2"],
                "HIES alpha=0.5": hies(his, entropy, 0.5),
            },
        )
    )
    return results, section(settings, results)


def _mean_points(points: list[dict[str, Any]]) -> dict[str, Any]:
    if len(points) == 1:
        return points[0]
    keys = measured(points[0])
    out = {k: float(np.mean([p[k] for p in points])) for k in keys}
    out.update({f"{k}_std": float(np.std([p[k] for p in points])) for k in keys})
    out["heads_kept"] = points[0]["heads_kept"]  # the same for every seed at one ratio
    out["seeds"] = points
    return out


def section(settings: ml_collections.ConfigDict, results: dict[str, Any]) -> list[str]:
    """The report's tables: one per metric, a row per criterion, a column per ratio."""
    lines = [
        "Stability is our definition: % of ID test examples whose predicted class equals the "
        "unpruned model's. Random is the mean over seeds "
        f"{list(settings.random_seeds)}. HIES alpha per ratio (chosen on validation accuracy): "
        + ", ".join(f"{float(r):.0%}: {a}" for r, a in results["hies_alpha"].items()),
        "",
    ]
    ratios = [str(r) for r in settings.ratios]
    labels = {
        "acc": "Accuracy %",
        "stability": "Stability % (ours)",
        "ece": "ECE %",
        "nll": "NLL",
        "ood_auroc": "Mean OOD AUROC %",
    }
    header = "| criterion | " + " | ".join(f"{float(r):.0%}" for r in ratios) + " |"
    for key in curve_metrics(results["curves"]):
        lines += [f"## {labels[key]}", "", header, "|---|" + "---|" * len(ratios)]
        for criterion, curve in results["curves"].items():
            scale = 1 if key == "nll" else 100
            cells = [f"{scale * curve[r][key]:.2f}" for r in ratios]
            lines.append(f"| {criterion} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _plot_curves(directory: Path, settings: ml_collections.ConfigDict, curves: dict) -> None:
    plt = pyplot()
    ratios = [float(r) for r in settings.ratios]
    keys = curve_metrics(curves)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.5))
    for ax, key in zip(axes, keys, strict=True):
        for criterion, curve in curves.items():
            y = np.array([curve[str(r)][key] for r in settings.ratios])
            ax.plot(ratios, y, marker="o", label=criterion)
            if f"{key}_std" in curve[str(settings.ratios[0])]:
                std = np.array([curve[str(r)][f"{key}_std"] for r in settings.ratios])
                ax.fill_between(ratios, y - std, y + std, alpha=0.2)
        ax.set(xlabel="fraction of heads pruned", title=key)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(directory / "pruning_curves.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for criterion, curve in curves.items():
        accuracy = [100 * curve[str(r)]["acc"] for r in settings.ratios]
        ax.plot(ratios, accuracy, marker="o", label=criterion)
    ax.set(xlabel="fraction of heads pruned", ylabel="test accuracy %", title="Accuracy vs pruning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(directory / "accuracy_vs_ratio.png", dpi=100)
    plt.close(fig)


def _plot_scores(directory: Path, scores: dict[str, np.ndarray]) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(scores), figsize=(3.5 * len(scores), 3))
    for ax, (name, s) in zip(axes, scores.items(), strict=True):
        image = ax.imshow(s, aspect="auto", cmap="viridis")
        ax.set(title=name, xlabel="head", ylabel="layer")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(directory / "head_scores.png", dpi=100)
    plt.close(fig)
