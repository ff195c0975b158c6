"""Hydra ablations the paper's reviewers asked for, from one published classifier.

For each ensemble size M of `config.sizes` and each head-set strategy of `config.strategies`
(`taylor`: each member's own top heads, so members overlap; `stratified`: disjoint sets), the
members (N / M heads per layer each, fine-tuned) are evaluated twice:

- `per_member_mlp`: the members as they are, run side by side: each keeps its own fine-tuned
  MLPs. This is also the ensemble *before* fusion.
- `averaged_mlp`: the fused Hydra, whose MLPs are the members' average (appendix B.7's claim is
  that this merge costs nothing). This is the ensemble *after* fusion.

Reported per row: head overlap (mean pairwise Jaccard index of the members' head sets), ID
accuracy / NLL / ECE, member disagreement and mutual information, mean OOD AUROC (MSP), params
and XLA FLOPs per example. `train` fine-tunes every member (resuming); `evaluate` evaluates them.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from hydra_jax import ensembles
from hydra_jax.data import subset
from hydra_jax.ensembles import baselines as forwards
from hydra_jax.evaluation import Method, cost, logits_forward, method_metrics, predict, softmax
from hydra_jax.evaluation.report import pyplot
from hydra_jax.experiments import baselines, common, hydra
from hydra_jax.models.sharding import is_primary
from hydra_jax.training import TrainSettings


def overlap(sets: np.ndarray) -> float:
    """Mean over member pairs of |A & B| / |A | B| of their kept heads `[M, L, N]`."""
    pairs = list(itertools.combinations(range(len(sets)), 2))
    return float(np.mean([(sets[a] & sets[b]).sum() / (sets[a] | sets[b]).sum()
                          for a, b in pairs]))  # fmt: skip


def _members(
    config: ml_collections.ConfigDict, workdir: Path
) -> tuple[dict[tuple[int, str], Any], common.StudyData]:
    """`{(M, strategy): (head sets, fine-tuned members)}`, fine-tuning what is not finished, and
    the base run's data."""
    (single,), study, base = baselines.trained(Path(config.base_workdir), indices=[0])
    train = subset(study.train, config.train_limit) if config.train_limit else study.train
    settings = TrainSettings(**{**base.train.to_dict(), **config.member_train.to_dict()})
    out, steps = {}, {}
    heads = single.config.encoder.num_heads[0]
    for M, strategy in itertools.product(config.sizes, config.strategies):
        if heads % M:
            raise ValueError(f"ensemble size {M} does not divide the {heads} heads per layer")
        sized = ml_collections.ConfigDict({**config.to_dict(), "num_members": M})
        sets = hydra.head_sets(sized, base, strategy, single, train)
        directory = workdir / "members" / f"M{M}_{strategy}"
        members = hydra.fine_tuned_members(single, sets, train, settings, base, directory, steps)
        out[M, strategy] = (sets, members)
    return out, study


def train(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """Fine-tunes the members of every (size, strategy) into `workdir` (resuming)."""
    workdir = Path(workdir)
    # The base run must exist, and bad settings are refused before the workdir is touched.
    base = common.recorded_config(Path(config.base_workdir))
    TrainSettings(**{**base.train.to_dict(), **config.member_train.to_dict()})
    common.claim_workdir(config, workdir)
    _members(config, workdir)


def evaluate(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Any]:
    """Evaluates every (size, strategy, MLP) row; writes results.json, report.md and plots/."""
    workdir = Path(workdir)
    common.check_workdir(config, workdir)
    start = time.perf_counter()
    built, study = _members(config, workdir)
    test = subset(study.test, config.eval_limit) if config.eval_limit else study.test
    ood = {n: subset(s, config.ood_limit) if config.ood_limit else s for n, s in study.ood.items()}
    stages = {"members (restored)": time.perf_counter() - start}
    batch = common.latency_batch(config, study)
    rows = []
    for (M, strategy), (sets, members) in built.items():
        start = time.perf_counter()
        fused = ensembles.fuse(members)
        methods = {
            "per_member_mlp": Method("per_member_mlp", forwards.deep_ensemble(members[0]),
                                     forwards.stack(members), stacked=True),
            "averaged_mlp": Method("averaged_mlp", logits_forward(fused), fused.params),
        }  # fmt: skip
        for mlp, method in methods.items():
            predictions = _predictions(method, test, ood, config.eval.batch_size)
            result = method_metrics(predictions, list(ood), config.eval.num_bins)
            rows.append({
                "size": M, "strategy": strategy, "mlp": mlp,
                "heads_per_member": int(sets[0, 0].sum()), "overlap": overlap(sets),
                **{k: result["id"][k] for k in ("acc", "nll", "ece", "disagreement",
                                                "mutual_information")},
                "ood_auroc": result["ood"]["mean"]["auroc"],
                **{k: v for k, v in cost(method, batch, 3).items()
                   if k in ("params", "flops_per_example")},
            })  # fmt: skip
        stages[f"M={M} {strategy}"] = time.perf_counter() - start
    results = {"rows": rows, "stages": stages, "config": json.loads(config.to_json_best_effort())}
    if is_primary():  # several processes: one writes
        (workdir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
        (workdir / "report.md").write_text(markdown(config, rows, stages))
        _plots(workdir / "plots", rows)
    return results


def _predictions(method: Method, test: Any, ood: dict[str, Any], batch_size: int) -> dict:
    out = {"labels": test.labels}
    for prefix, dataset in {"id": test, **{f"ood_{n}": s for n, s in ood.items()}}.items():
        logits = predict(method, dataset, batch_size)
        out[f"{prefix}_logits"], out[f"{prefix}_probs"] = logits, softmax(logits)
    return out


def markdown(config: ml_collections.ConfigDict, rows: list[dict], stages: dict) -> str:
    lines = [f"# {config.title}", ""]
    lines += [
        "Per ensemble size M and head-set strategy (taylor: members overlap; stratified: "
        "disjoint), the fine-tuned members side by side (`per_member_mlp`, before fusion) and "
        "fused (`averaged_mlp`, after fusion). Overlap: mean pairwise Jaccard index of the "
        "members' head sets. OOD AUROC: MSP score, mean over the OOD sets.",
        "",
    ]
    lines += [
        "| M | heads / member | head sets | overlap % | MLP | acc % | NLL | ECE % | disagreement "
        "% | MI | OOD AUROC % | params | MFLOPs / example |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['heads_per_member']} | {r['strategy']} | "
            f"{100 * r['overlap']:.1f} | {r['mlp']} | {100 * r['acc']:.2f} | {r['nll']:.4f} | "
            f"{100 * r['ece']:.2f} | {100 * r['disagreement']:.2f} | "
            f"{r['mutual_information']:.4f} | {100 * r['ood_auroc']:.2f} | {r['params']:,} | "
            f"{r['flops_per_example'] / 1e6:.2f} |"
        )
    lines += ["", "## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in stages.items()]
    return "\n".join(lines) + "\n"


def _plots(directory: Path, rows: list[dict]) -> None:
    """One plot per ablation: ensemble size, overlap, MLP merge, disagreement before/after."""
    plt = pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    strategies = sorted({r["strategy"] for r in rows})
    panels = {
        "ensemble_size": ("ood_auroc", "mean OOD AUROC", "averaged_mlp"),
        "mlp_merge": ("acc", "ID accuracy", None),
        "disagreement": ("disagreement", "member disagreement", None),
    }
    for name, (key, label, only) in panels.items():
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for strategy in strategies:
            for mlp in ("averaged_mlp", "per_member_mlp"):
                if only and mlp != only:
                    continue
                points = sorted((r["size"], r[key]) for r in rows
                                if r["strategy"] == strategy and r["mlp"] == mlp)  # fmt: skip
                style = "-" if mlp == "averaged_mlp" else "--"
                ax.plot(*zip(*points, strict=True), style, marker="o",
                        label=f"{strategy}, {mlp.replace('_', ' ')}")  # fmt: skip
        ax.set(xlabel="ensemble size M", ylabel=label, title=name.replace("_", " "))
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(directory / f"{name}.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for strategy in strategies:
        points = sorted({(r["size"], r["overlap"]) for r in rows if r["strategy"] == strategy})
        ax.plot(*zip(*points, strict=True), marker="o", label=strategy)
    ax.set(xlabel="ensemble size M", ylabel="head overlap (Jaccard)", title="overlap")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(directory / "overlap.png", dpi=100)
    plt.close(fig)
