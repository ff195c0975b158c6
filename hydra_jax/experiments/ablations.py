"""The `ablations` analysis: the Hydra ablations the paper's reviewers asked for, on member 0.

For each ensemble size M of `ablations.sizes` and each head-set strategy of
`ablations.strategies` (`taylor`: each member's own top heads, so members overlap; `stratified`:
disjoint sets), the members (N / M heads per layer each, fine-tuned) are evaluated twice:

- `per_member_mlp`: the members as they are, run side by side: each keeps its own fine-tuned
  MLPs. This is also the ensemble *before* fusion.
- `averaged_mlp`: the fused Hydra, whose MLPs are the members' average (appendix B.7's claim is
  that this merge costs nothing). This is the ensemble *after* fusion.

Reported per row: head overlap (mean pairwise Jaccard index of the members' head sets), ID
accuracy / NLL / ECE, member disagreement and mutual information, mean OOD AUROC (MSP), params
and XLA FLOPs per example. `train` chooses the head sets and fine-tunes every member (resuming,
with the study's Hydra member settings), saving each; `evaluate` loads and evaluates them (it
trains nothing).
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from hydra_jax import checks, ensembles
from hydra_jax.convert.native import load_model, save_model
from hydra_jax.data import subset
from hydra_jax.ensembles import baselines as forwards
from hydra_jax.evaluation import Method, cost, logits_forward
from hydra_jax.evaluation.report import pyplot
from hydra_jax.experiments import evaluators, members, study_data
from hydra_jax.experiments.analyses import Context

HEAD_SETS_FILE = "ablation_head_sets.json"  # per row name M{M}_{strategy}: [M, L, N] kept heads


def overlap(sets: np.ndarray) -> float:
    """Mean over member pairs of |A & B| / |A | B| of their kept heads `[M, L, N]`."""
    pairs = list(itertools.combinations(range(len(sets)), 2))
    return float(np.mean([(sets[a] & sets[b]).sum() / (sets[a] | sets[b]).sum() for a, b in pairs]))


def row_name(size: int, strategy: str) -> str:
    return f"M{size}_{strategy}"


def train(context: Context) -> None:
    """Per (size, strategy): member head sets from member 0, members fine-tuned (resuming,
    with the Hydra members' settings); saves each member (`saved/M{M}_{strategy}/member_m`) and
    the head sets (`ablation_head_sets.json`)."""
    config, workdir, single = context.config, context.workdir, context.single
    d, settings = config.data, config.ablations
    train = context.data.study.train
    train_set = subset(train, d.train_limit) if d.train_limit else train
    record, steps = {}, {}
    for M, strategy in itertools.product(settings.sizes, settings.strategies):
        name = row_name(M, strategy)
        seeds = members.member_seeds(context.plan.members_config, M)
        with workdir.stage(f"M={M} {strategy}"):
            sets = members.head_sets(config, strategy, single, train_set, seeds, num_members=M)
            directory = workdir.at("ablation_training", name=name)
            fine_tuned = members.fine_tuned_members(
                single, sets, train_set, context.plan.hydra_settings, seeds, directory, steps
            )
        for m, member in enumerate(fine_tuned):
            save_model(member, workdir.at("ablation_member", name=name, m=m))
        record[name] = sets.astype(int).tolist()
    workdir.write_json(HEAD_SETS_FILE, record)


def check(context: Context) -> None:
    """Refuses no sizes or strategies, an unknown strategy, and an ensemble size below 2 or that
    does not divide member 0's heads per layer."""
    settings = context.config.ablations
    for key in ("sizes", "strategies"):
        if not settings[key]:
            raise ValueError(f"ablations.{key} is empty")
    unknown = sorted(set(settings.strategies) - set(ensembles.STRATEGIES))
    if unknown:
        raise ValueError(
            f"ablations.strategies: unknown {unknown}; known: {', '.join(ensembles.STRATEGIES)}"
        )
    for M in settings.sizes:
        checks.count("ablations.sizes", M, minimum=2)  # overlap and disagreement need 2
        try:
            ensembles.heads_per_member(context.single, M)
        except ValueError as error:
            raise ValueError(f"ablations.sizes: {error}") from None


def evaluate(context: Context) -> tuple[dict[str, Any], list[str]]:
    """Every (size, strategy, MLP) row from the members `train` saved (and plots/); returns the
    results (`rows`) and the report section."""
    config, workdir, study = context.config, context.workdir, context.data.study
    record = workdir.read_json(workdir.require(workdir / HEAD_SETS_FILE, "ablation head sets"))
    d = config.data
    test = subset(study.test, d.eval_limit) if d.eval_limit else study.test
    ood = {n: subset(s, d.ood_limit) if d.ood_limit else s for n, s in study.ood.items()}
    batch = study_data.latency_batch(config, study.test)
    prediction_sets = evaluators.Sets(test, ood)
    scoring = [evaluators.Classification(config.eval.num_bins), evaluators.OODDetection(tuple(ood))]
    rows = []
    for M, strategy in itertools.product(config.ablations.sizes, config.ablations.strategies):
        name = row_name(M, strategy)
        sets = np.array(record[name], bool)
        with workdir.stage(f"evaluate M={M} {strategy}"):
            saved = [workdir.at("ablation_member", name=name, m=m) for m in range(M)]
            fine_tuned = [load_model(workdir.require(path, "saved member")) for path in saved]
            fused = ensembles.fuse(fine_tuned)
            methods = {
                "per_member_mlp": Method(
                    "per_member_mlp",
                    forwards.deep_ensemble(fine_tuned[0]),
                    forwards.stack(fine_tuned),
                    stacked=True,
                ),
                "averaged_mlp": Method("averaged_mlp", logits_forward(fused), fused.params),
            }
            for mlp, method in methods.items():
                predictions = evaluators.predictions_of(
                    method, prediction_sets, config.eval.batch_size
                )
                result = evaluators.score(scoring, predictions, method)
                rows.append(
                    {
                        "size": M,
                        "strategy": strategy,
                        "mlp": mlp,
                        "heads_per_member": int(sets[0, 0].sum()),
                        "overlap": overlap(sets),
                        **{
                            k: result["id"][k]
                            for k in ("acc", "nll", "ece", "disagreement", "mutual_information")
                        },
                        "ood_auroc": result["ood"]["mean"]["auroc"] if ood else None,
                        **{
                            k: v
                            for k, v in cost(method, batch, 3).items()
                            if k in ("params", "flops_per_example")
                        },
                    }
                )
    workdir.write_plots(functools.partial(_plots, rows=rows))
    return {"rows": rows}, section(rows)


def section(rows: list[dict]) -> list[str]:
    """The report's table: a row per (size, strategy, MLP)."""
    lines = [
        "Per ensemble size M and head-set strategy (taylor: members overlap; stratified: "
        "disjoint), the fine-tuned members side by side (`per_member_mlp`, before fusion) and "
        "fused (`averaged_mlp`, after fusion). Overlap: mean pairwise Jaccard index of the "
        "members' head sets. OOD AUROC: MSP score, mean over the OOD sets.",
        "",
        "| M | heads / member | head sets | overlap % | MLP | acc % | NLL | ECE % | disagreement "
        "% | MI | OOD AUROC % | params | MFLOPs / example |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        auroc = "-" if r["ood_auroc"] is None else f"{100 * r['ood_auroc']:.2f}"  # no OOD sets
        lines.append(
            f"| {r['size']} | {r['heads_per_member']} | {r['strategy']} | "
            f"{100 * r['overlap']:.1f} | {r['mlp']} | {100 * r['acc']:.2f} | {r['nll']:.4f} | "
            f"{100 * r['ece']:.2f} | {100 * r['disagreement']:.2f} | "
            f"{r['mutual_information']:.4f} | {auroc} | {r['params']:,} | "
            f"{r['flops_per_example'] / 1e6:.2f} |"
        )
    return lines


def _plots(directory: Path, rows: list[dict]) -> None:
    """One plot per ablation: ensemble size, overlap, MLP merge, disagreement before/after."""
    plt = pyplot()
    strategies = sorted({r["strategy"] for r in rows})
    panels = {
        "ensemble_size": ("ood_auroc", "mean OOD AUROC", "averaged_mlp"),
        "mlp_merge": ("acc", "ID accuracy", None),
        "disagreement": ("disagreement", "member disagreement", None),
    }
    if rows[0]["ood_auroc"] is None:  # a study without OOD sets
        del panels["ensemble_size"]
    for name, (key, label, only) in panels.items():
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for strategy in strategies:
            for mlp in ("averaged_mlp", "per_member_mlp"):
                if only and mlp != only:
                    continue
                points = sorted(
                    (r["size"], r[key])
                    for r in rows
                    if r["strategy"] == strategy and r["mlp"] == mlp
                )
                style = "-" if mlp == "averaged_mlp" else "--"
                ax.plot(
                    *zip(*points, strict=True),
                    style,
                    marker="o",
                    label=f"{strategy}, {mlp.replace('_', ' ')}",
                )
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
