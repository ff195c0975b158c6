"""The study engine: one `train` and one `evaluate` for every study.

A study config declares the work (every file of `configs/`); `train` does it, in this order:

1. **Members** (methods `single`, `deep_ensemble`, `mc_dropout`): `ensemble_size` classifiers
   (one unless a deep ensemble is named), member m with training seed `1000 * seed + m`. Each
   starts from the checkpoint (`model`, a local HF directory; or `checkpoint`, "" for the
   embedded MiniLM) with its own classifier, or a new one sized from the labels; or from a
   fresh ViT (`model`, a ConfigDict). Fine-tuned on the training set, it is published as an HF
   directory `hf/member_M` with the checkpoint's preprocessing files. Where they come from is
   the config's `members_from`: `checkpoint`, `scratch`, or `workdir`, which trains none: it
   reads `base_workdir`'s members, and the config they were trained under decides the data,
   the seeds and the training settings. With
   `zero_shot.enabled`, member 0 is a dual encoder's zero-shot classifier and no classifier
   trains; the dual encoder is the checkpoint, or, where `model` is a ViT to train from
   scratch, one trained here beside the checkpoint's locked text tower (`dual_encoder`).
2. **Hydras** (methods `hydra_S`, `pruned_S`; `strategies`): per strategy S, member head sets
   from member 0, the members compacted and fine-tuned (`member_train` over the members'
   `train`), then fused (`fused/S`; member 0 alone in `pruned/S`), and optionally the fused
   network fine-tuned as a whole (`fused_train`). A zero-shot classifier's members are pruned
   and fused as they are, their head sets chosen on the ID validation split where there is one.
3. **Single-pass ensembles** (`batch_ensemble`, `lora_ensemble`, `packed_ensemble`, `mimo`),
   trained where the members are (`efficient/KIND`).
4. **Analyses** (`analyses`: `pruning_curves`, `ablations`; `ANALYSES`): their train step on
   member 0.

What a config asks for and every check before the first step are in `plan`; the data
(`study_inputs.load_data`) are the embedded sets of the paper studies (`data.id_set`,
`data.ood_sets`: `study_data`) or your files (`data.train`, `data.test`, ...: `user_files`);
the classes `zero_shot.held_out` names are taken out of the training and validation sets.
`evaluate` loads what `train` wrote and never trains: every method of `methods` goes through the
prediction loop and the evaluators (`evaluators.study`: those `evaluators` names), every
analysis evaluates, and `results.json` and `report.md` are written here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import ml_collections

from hydra_jax import ensembles
from hydra_jax.convert.native import save_model
from hydra_jax.data import Dataset
from hydra_jax.evaluation import report
from hydra_jax.experiments import evaluators, members, methods, single_pass
from hydra_jax.experiments.analyses import Context
from hydra_jax.experiments.evaluators import plots
from hydra_jax.experiments.plan import (
    ANALYSES,
    Plan,
)
from hydra_jax.experiments.sources import Members
from hydra_jax.experiments.study_inputs import Data, held_out, load_data
from hydra_jax.experiments.workdir import CONFIG_FILE, Workdir, layout
from hydra_jax.models import Model
from hydra_jax.models.sharding import barrier, make_mesh
from hydra_jax.training import fit


def saved_path(workdir: Path, method: str) -> Path:
    """Where `train` saves method `hydra_S` (the fused network) or `pruned_S` (member 0)."""
    kind, strategy = method.split("_", 1)
    return layout(workdir, "hydra" if kind == "hydra" else "pruned", strategy=strategy)


def run(
    stage: str,
    config: ml_collections.ConfigDict,
    workdir: Workdir | Path | str,
    distributed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Runs `stage` ("train" or "evaluate") of the study `config` in `workdir`, with the run's
    guarantees: the workdir is held for the whole stage (a second run on it is refused, naming
    the process that holds it), the work is laid out on `config.mesh` (no mesh on one device),
    and with `distributed` (`jax.distributed.initialize`'s arguments) this process first joins
    the others. The command line (`train.py`, `evaluate.py`, `hydra-jax`) and the tests call
    this, through `train` and `evaluate`."""
    if stage not in ("train", "evaluate"):
        raise ValueError(f"unknown stage {stage!r}: 'train' or 'evaluate'")
    if distributed is not None and not jax.distributed.is_initialized():
        jax.distributed.initialize(**distributed)
    workdir = Workdir.of(workdir)
    mesh = make_mesh(**config.get("mesh", {}))  # on one device, no mesh at all: nothing moves
    with (
        workdir.hold(create=stage == "train", lock=config.get("workdir_lock", "flock")),
        jax.set_mesh(mesh) if mesh.size > 1 else contextlib.nullcontext(),
    ):
        return (_train if stage == "train" else _evaluate)(config, workdir)


def train(config: ml_collections.ConfigDict, workdir: Workdir | Path | str) -> dict[str, Any]:
    """The train stage (`run("train", ...)`): see `_train`."""
    return run("train", config, workdir)


def evaluate(config: ml_collections.ConfigDict, workdir: Workdir | Path | str) -> dict[str, Any]:
    """The evaluate stage (`run("evaluate", ...)`): see `_evaluate`."""
    return run("evaluate", config, workdir)


def _train(config: ml_collections.ConfigDict, workdir: Workdir) -> dict[str, Any]:
    """Trains the members, builds every Hydra and single-pass ensemble the config names and
    runs the train step of its analyses (resuming where an earlier run stopped). Returns the
    members this run trained or restored (`members`: none when they come from a workdir or
    zero-shot) and the Hydra members' head sets per strategy (`head_sets`)."""
    plan = Plan.of(config, workdir)  # bad settings refused before the workdir is touched
    first_run = not (workdir / CONFIG_FILE).is_file()
    with workdir.stage("load data", record=first_run):  # a rerun keeps the first run's times
        source = Members.load(config, plan)
    source.check(workdir)  # what the data and the starting model decide, before any training
    workdir.claim(config)
    single, trained = source.member_zero(workdir)
    data = source.data
    record = build_hydras(config, workdir, plan, single, source.calibration(), data.validation)
    for kind in plan.efficient:
        train_efficient(source, workdir, kind, single)
    for name in plan.analyses:
        ANALYSES[name].train(Context(config, workdir, plan, single, data))
    if data.classes is not None:
        workdir.write_json("classes.json", list(data.classes.names))
    if plan.strategies:
        workdir.write_json("head_sets.json", record)
    workdir.save_stages()  # a member an earlier run trained keeps that run's time
    barrier("wrote the training record")
    return {"members": trained, "head_sets": record}


def build_hydras(
    config: ml_collections.ConfigDict,
    workdir: Workdir,
    plan: Plan,
    single: Model,
    train_set: Dataset,
    validation: Callable[[], tuple[Dataset | None, Dataset | None]],
) -> dict[str, list]:
    """Per strategy of `plan`: member head sets from `single` (calibrated on `train_set`; the
    circuit search on `validation()`), the members fine-tuned on `train_set` (zero-shot: pruned
    as they are), fused, saved with member 0 alone. Returns the head sets."""
    seeds = members.member_seeds(plan.members_config, config.get("num_members", 0))
    record: dict[str, list] = {}
    steps: dict[Any, Any] = {}  # compiled train steps (`shared_step`): members', fused ones'
    for strategy in plan.strategies:
        with workdir.stage(f"{strategy}: head sets"):
            sets = members.head_sets(config, strategy, single, train_set, seeds, validation)
        record[strategy] = sets.astype(int).tolist()
        verb = "prune" if plan.zero_shot else "fine-tune"
        with workdir.stage(f"{strategy}: {verb} members"):
            if plan.zero_shot:
                pruned = ensembles.members_from(single, sets)
            else:
                directory = workdir.at("hydra_member_training", strategy=strategy)
                pruned = members.fine_tuned_members(
                    single, sets, train_set, plan.hydra_settings, seeds, directory, steps
                )
        fused = ensembles.fuse(pruned)
        if plan.fused_settings is not None:
            with workdir.stage(f"{strategy}: fine-tune fused"):
                settings = plan.fused_settings
                step_fn = members.shared_step(steps, fused, len(train_set), settings)
                directory = workdir.at("fused_training", strategy=strategy)
                fused = fit(fused, train_set, settings, directory, step_fn=step_fn)
        save_model(fused, saved_path(workdir.path, f"hydra_{strategy}"))
        save_model(pruned[0], saved_path(workdir.path, f"pruned_{strategy}"))
    return record


def train_efficient(source: Members, workdir: Workdir, kind: str, single: Model) -> Model:
    """The single-pass ensemble `kind`, started where member 0 starts (a Packed-Ensemble and
    MIMO take only the architecture); a kind with a frozen backbone (LoRA-Ensemble) of a model
    trained from scratch adapts the trained member 0 (a frozen backbone must have learnt
    something), with a new head per member unless the checkpoint brought its own classifier."""
    config, base = source.config, source.base
    seed = members.training_seed(config, 0)
    start = source.starting_point(seed)
    if single_pass.METHODS[kind].frozen_backbone and base is None:
        start = single
    own_head = base is not None and getattr(base.config, "num_labels", 0) > 0
    ensemble = members.efficient_ensemble(
        config, kind, start, seed, 0 if own_head else source.data.num_classes
    )
    settings = dataclasses.replace(members.efficient_settings(config, kind), seed=seed)
    loss = members.efficient_loss(config, kind, ensemble)
    return members.fit_efficient(workdir, kind, ensemble, source.data.study.train, settings, loss)


def _evaluate(config: ml_collections.ConfigDict, workdir: Workdir) -> dict[str, Any]:
    """Evaluates every method of `config.methods` (through `evaluators.study`) and every
    analysis of `config.analyses` from what `train` wrote (the members in `base_workdir` where
    the config names one); trains nothing. Writes results.json, report.md, plots/ and
    predictions/."""
    workdir.check(config)
    plan = Plan.of(config, workdir)
    trained = methods.Trained(
        plan.workdir, plan.members_config, workdir, config.eval.get("dtype", "float32")
    )
    with workdir.stage("load data"):
        to_evaluate = methods.build(plan.methods, trained) if plan.methods else []
        data = load_data(plan.members_config, trained.member(0))
    results: dict[str, Any] = {}
    sections: list[list[str]] = []
    if to_evaluate:
        groups = evaluators.ood_groups(plan.members_config, list(data.study.ood))
        sets = evaluators.sets_of(config, data.study, data.id_validation(), groups)
        chosen = evaluators.study(config, sets, held_out(plan.members_config, data))
        results["methods"], method_sections = evaluators.evaluate_methods(
            config, workdir, to_evaluate, sets, chosen
        )
        draw = functools.partial(
            plots.study_plots, results["methods"], tuple(evaluators.ood_scores(config))
        )
        workdir.write_plots(draw)
        sections += [*method_sections, plots.section(results["methods"])]
    for name in plan.analyses:
        context = Context(config, workdir, plan, trained.member(0), data)
        analysis_results, section = ANALYSES[name].evaluate(context)
        clash = sorted(set(analysis_results) & {*results, "stages", "data"})
        if clash:
            raise ValueError(f"analysis {name} returns results under taken keys {clash}")
        results |= analysis_results
        sections.append(section)
    if data.skipped_images:
        results["data"] = {"skipped_images": data.skipped_images}
        sections.append(report.skipped_images_section(data.skipped_images))
    results["stages"] = workdir.train_stages()
    text = report.markdown(config.title, sections, results["stages"], bool(to_evaluate))
    logs = report.training_logs(workdir.path)
    if logs:  # the runs this workdir trained (a study on another's models: none)
        draw = functools.partial(report.loss_curves, logs=logs, title=config.title)
        workdir.write_plots(lambda directory: draw(directory / "training_loss.png"))
        text += report.training_section(logs, "plots/training_loss.png")
    workdir.write_results(results, text, config)
    barrier("wrote the results")
    return results


def published(workdir: Workdir | Path, indices: list[int]) -> tuple[list[Model], Data, Any]:
    """The published member classifiers `indices` of a study's workdir (`hf/member_M`, read with
    `from_pretrained`), with its data and recorded config."""
    workdir = Workdir.of(workdir)
    config = workdir.recorded()
    trained = methods.Trained(workdir, config, workdir)
    models = [trained.member(index) for index in indices]
    return models, load_data(config, models[0]), config
