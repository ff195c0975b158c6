"""Evaluation of a study's methods: one prediction loop, then evaluators.

A study declares its evaluators by name (`config.evaluators`, e.g.
`"classification,calibration,selective,conformal,ood,shift,cost"`; empty: every one its data
allow) and its OOD scores (`config.ood_scores`). An evaluator is a small object: called on one
method's predictions (the arrays of `predictions/NAME.npz`), it returns that method's metrics
under its `key` in `results.json`; `section` turns every method's results into its part of
`report.md`; `needs` names the prediction sets it reads beyond the ID test set. `study`
builds a study's evaluators from its config and data; `predictions_of` is the one prediction
loop, which the analyses (pruning curves, ablations) use too, scoring through the same
evaluator objects. A new evaluator is one class here and one line of `EVALUATORS`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import ml_collections
import numpy as np

from hydra_jax import metrics
from hydra_jax.data import Dataset, subset
from hydra_jax.ensembles.baselines import NoFeaturesError
from hydra_jax.evaluation import Method, cost, predict, report
from hydra_jax.evaluation import softmax as to_probs
from hydra_jax.experiments.study_data import OOD_GROUPS as OWN_GROUPS
from hydra_jax.experiments.study_data import StudyData, latency_batch
from hydra_jax.experiments.user_files import named_specs
from hydra_jax.experiments.workdir import Workdir, split_names
from hydra_jax.metrics import conformal, detectors, selective, temperature

Predictions = dict[str, np.ndarray]

OUTPUT_SCORES = ("msp", "entropy", "mi", "energy", "max_logit")  # from the outputs
FEATURE_SCORES = detectors.DETECTORS  # from the member features, fitted on training data
OOD_SCORES = OUTPUT_SCORES + FEATURE_SCORES
OOD_GROUPS = ("near", "far")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the evaluators' metrics take (`config.eval`; defaults where a config predates
    them): bins of every ECE; conformal `alpha` and RAPS's `raps_penalty`, `raps_k`; KNN's
    `knn_k`; ViM's `vim_dim` (0: half the feature dimension); how many training examples the
    feature detectors fit on (`feature_fit_limit`) and validation examples temperature scaling
    and conformal calibration use (`calibration_limit`), each a fixed random subset (seed 0; 0
    = all); the dtype member features are stored in (`features_dtype`), which the detectors
    then read, so the saved arrays reproduce every number."""

    num_bins: int = 15
    alpha: float = 0.1
    raps_penalty: float = 0.01
    raps_k: int = 5
    knn_k: int = 50
    vim_dim: int = 0
    feature_fit_limit: int = 1000
    calibration_limit: int = 1000
    features_dtype: str = "float16"

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> Settings:
        e = config.get("eval", {})
        defaults = cls()
        return cls(
            **{f.name: e.get(f.name, getattr(defaults, f.name)) for f in dataclasses.fields(cls)}
        )


def eval_fields() -> dict[str, Any]:
    """`Settings`' fields and defaults, for a study config's `eval` group."""
    return dataclasses.asdict(Settings())


class Evaluator(Protocol):
    key: ClassVar[str]  # where its metrics go in results.json, per method
    needs: ClassVar[frozenset[str]]  # prediction sets beyond the ID test set: `SETS`

    def __call__(self, predictions: Predictions, method: Method) -> Any: ...

    def section(self, methods: dict[str, Any]) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class Classification:
    """Accuracy, NLL, Brier, ECE (equal-width bins), aECE, MCE, classwise ECE, entropy and, for
    ensembles, mutual information and member disagreement on the ID test set."""

    num_bins: int = 15
    key: ClassVar[str] = "id"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, float]:
        return metrics.classification(predictions["id_probs"], predictions["labels"], self.num_bins)

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.id_table(methods)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Temperature scaling (`metrics.temperature`: one temperature per method, shared by its
    members, fitted by NLL on the validation subset), and every ID and shift metric of
    `Classification` after it."""

    shift: tuple[str, ...] = ()
    num_bins: int = 15
    key: ClassVar[str] = "calibration"
    needs: ClassVar[frozenset[str]] = frozenset({"validation"})

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        t = temperature.fit(predictions["val_logits"], predictions["val_labels"])

        def after(prefix: str, labels: np.ndarray) -> dict[str, float]:
            probs = temperature.scaled(predictions[f"{prefix}_logits"], t)
            return metrics.classification(probs, labels, self.num_bins)

        shifted = {n: after(f"shift_{n}", predictions["shift_labels"]) for n in self.shift}
        return {"temperature": t, "id": after("id", predictions["labels"]), "shift": shifted}

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.calibration_table(methods)


@dataclasses.dataclass(frozen=True)
class Selective:
    """Selective classification by the member-mean confidence (max_c p_c) on the ID test set:
    AURC, AUGRC and the selective risk at 80, 90 and 95% coverage (`metrics.selective`)."""

    key: ClassVar[str] = "selective"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, float]:
        p = predictions["id_probs"].astype(np.float64).mean(1)
        return selective.selective(p.max(-1), p.argmax(-1) == predictions["labels"])

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.selective_table(methods)


@dataclasses.dataclass(frozen=True)
class Conformal:
    """Split-conformal sets (LAC, APS, RAPS; `metrics.conformal`) calibrated on the validation
    subset at `alpha`: coverage and mean set size on the ID test set and each shifted set."""

    shift: tuple[str, ...] = ()
    alpha: float = 0.1
    penalty: float = 0.01
    k_reg: int = 5
    key: ClassVar[str] = "conformal"
    needs: ClassVar[frozenset[str]] = frozenset({"validation"})

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        sets = {"test": (predictions["id_probs"], predictions["labels"])}
        sets |= {
            f"shift_{n}": (predictions[f"shift_{n}_probs"], predictions["shift_labels"])
            for n in self.shift
        }
        val = (predictions["val_probs"], predictions["val_labels"])
        out: dict[str, Any] = {"alpha": self.alpha}
        for name in conformal.METHODS:
            out[name] = conformal.conformal(
                *val,
                sets,
                name,
                self.alpha,
                self.penalty,
                self.k_reg,  # type: ignore[arg-type]
            )
        return out

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.conformal_table(methods)


@dataclasses.dataclass(frozen=True)
class OODDetection:
    """Detection of each OOD test set against the ID test set by every score of `scores`: the
    output scores of `metrics.ood_score`, and the feature detectors of `metrics.detectors`
    (fitted per member on the training subset's features; the member mean of the score). The
    results hold, per set, MSP's AUROC / AUPR / FPR95 and every score's (`by_score`), and the
    means over all sets (`mean`) and over each group's (`mean_near`, `mean_far`); a feature
    detector's mean AUROC of each member alone is under `mean.by_member`. A detector
    that cannot be fitted on the training subset (ViM with fewer examples than feature
    dimensions, KNN with fewer than k) is left out, its reason under `mean.skipped`."""

    ood_sets: tuple[str, ...]
    scores: tuple[str, ...] = OUTPUT_SCORES
    groups: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    knn_k: int = 50
    vim_dim: int = 0
    key: ClassVar[str] = "ood"

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"features"} if set(self.scores) & set(FEATURE_SCORES) else ())

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        members = predictions["id_probs"].shape[1]
        names = [s for s in self.scores if s != "mi" or members > 1]
        prefixes = ["id", *(f"ood_{n}" for n in self.ood_sets)]
        scores = {p: self._output_scores(predictions, p, names) for p in prefixes}
        skipped: dict[str, str] = {}
        by_member: dict[str, list[float]] = {}  # a feature detector's mean AUROC per member
        for detector in (s for s in names if s in FEATURE_SCORES):
            try:
                fitted = self._feature_scores(predictions, detector, prefixes)
            except detectors.CannotFitError as error:
                skipped[detector] = str(error)
                continue
            for p, s in fitted.items():
                scores[p][detector] = s.mean(1)  # the member mean of the score
            by_member[detector] = [
                float(np.mean([metrics.ood(fitted["id"][:, m], fitted[p][:, m])["auroc"]
                               for p in prefixes[1:]]))
                for m in range(members)
            ] if self.ood_sets else []  # fmt: skip
        names = [s for s in names if s not in skipped]
        ood: dict[str, Any] = {}
        for name in self.ood_sets:
            by_score = {s: metrics.ood(scores["id"][s], scores[f"ood_{name}"][s]) for s in names}
            ood[name] = {**by_score["msp"], "by_score": by_score}
            if name in self.groups:
                ood[name]["group"] = self.groups[name]
        for label, sets in self._means().items():
            by_score = {
                s: {k: float(np.mean([ood[n]["by_score"][s][k] for n in sets])) for k in _OOD_KEYS}
                for s in names
            }
            ood[label] = {**by_score["msp"], "by_score": by_score}
        if self.ood_sets and by_member:
            ood["mean"]["by_member"] = by_member
        if self.ood_sets and skipped:
            ood["mean"]["skipped"] = skipped
        return ood

    def _means(self) -> dict[str, list[str]]:
        """The OOD sets each mean averages: all (`mean`), and each group's."""
        if not self.ood_sets:  # a study may have none (calibration only)
            return {}
        means = {"mean": list(self.ood_sets)}
        for group in OOD_GROUPS:
            sets = [n for n in self.ood_sets if self.groups.get(n) == group]
            if sets:
                means[f"mean_{group}"] = sets
        return means

    @staticmethod
    def _output_scores(
        predictions: Predictions, prefix: str, names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        probs, logits = predictions[f"{prefix}_probs"], predictions[f"{prefix}_logits"]
        return {s: metrics.ood_score(probs, s, logits) for s in names if s in OUTPUT_SCORES}

    def _feature_scores(
        self, predictions: Predictions, detector: str, prefixes: list[str]
    ) -> dict[str, np.ndarray]:
        if "train_features" not in predictions:
            raise detectors.CannotFitError("the method's model outputs no features")
        train = (
            predictions["train_features"],
            predictions["train_labels"],
            predictions["train_logits"],
        )
        sets = {p: (predictions[f"{p}_features"], predictions[f"{p}_logits"]) for p in prefixes}
        num_classes = predictions["id_logits"].shape[-1]
        return detectors.member_scores(
            detector,  # type: ignore[arg-type]
            train,
            sets,
            num_classes,
            self.knn_k,
            self.vim_dim,
        )

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.ood_tables(methods, self.scores)


_OOD_KEYS = ("auroc", "aupr", "fpr95")


@dataclasses.dataclass(frozen=True)
class Shift:
    """Accuracy, NLL and ECE on each shifted copy of the ID test set (`CORRUPTION_SEVERITY`)."""

    names: tuple[str, ...]
    num_bins: int = 15
    key: ClassVar[str] = "shift"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        return {
            name: metrics.classification(
                predictions[f"shift_{name}_probs"], predictions["shift_labels"], self.num_bins
            )
            for name in self.names
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.shift_tables(methods)


@dataclasses.dataclass(frozen=True)
class Cost:
    """Parameters, XLA FLOPs per example and the median latency of one fixed batch."""

    batch: dict[str, np.ndarray] = dataclasses.field(hash=False, compare=False)
    repeats: int = 10
    key: ClassVar[str] = "cost"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, float]:
        return cost(method, self.batch, self.repeats)

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.cost_table(methods)


@dataclasses.dataclass(frozen=True)
class HeldOutClasses:
    """Accuracy, NLL and ECE on the seen and the held-out classes separately (`held_out`: a
    bool mask over the ID test set), and misclassification detection (wrong = positive)."""

    held_out: np.ndarray = dataclasses.field(hash=False, compare=False)
    names: tuple[str, ...] = ()  # the held-out classes, for the report
    key: ClassVar[str] = "zero_shot"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: Predictions, method: Method) -> dict[str, Any]:
        probs, labels, held = predictions["id_probs"], predictions["labels"], self.held_out
        return {
            "seen": metrics.classification(probs[~held], labels[~held]),
            "held_out": metrics.classification(probs[held], labels[held]),
            "misclassification": metrics.misclassification(probs, labels),
        }

    def section(self, methods: dict[str, Any]) -> list[str]:
        return report.held_out_tables(methods, self.names)


@dataclasses.dataclass(frozen=True)
class Sets:
    """What a study evaluates on: the ID test set, the OOD test sets (with their groups), the
    shifted sets, and the subsets of validation (temperature scaling, conformal calibration)
    and training data (feature detectors), None where the study has none."""

    test: Dataset
    ood: dict[str, Dataset]
    shift: dict[str, Dataset] = dataclasses.field(default_factory=dict)
    validation: Dataset | None = None
    train: Dataset | None = None
    groups: dict[str, str] = dataclasses.field(default_factory=dict)


# Each evaluator by name: `(settings, sets, config) -> Evaluator`, and whether the sets allow it.
Build = Callable[[Settings, Sets, ml_collections.ConfigDict], Evaluator]
EVALUATORS: dict[str, Build] = {
    "classification": lambda s, sets, c: Classification(s.num_bins),
    "calibration": lambda s, sets, c: Calibration(tuple(sets.shift), s.num_bins),
    "selective": lambda s, sets, c: Selective(),
    "conformal": lambda s, sets, c: Conformal(tuple(sets.shift), s.alpha, s.raps_penalty, s.raps_k),
    "ood": lambda s, sets, c: OODDetection(
        tuple(sets.ood), tuple(ood_scores(c)), sets.groups, s.knn_k, s.vim_dim
    ),
    "shift": lambda s, sets, c: Shift(tuple(sets.shift), s.num_bins),
    "cost": lambda s, sets, c: Cost(latency_batch(c, sets.test), c.eval.latency_repeats),
}


def _named(config: ml_collections.ConfigDict, field: str, known: Sequence[str]) -> list[str]:
    """The names `config.FIELD` lists, or a ValueError naming the unknown and the known ones."""
    chosen = split_names(config.get(field, ""))
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise ValueError(f"config.{field}: unknown {unknown}; known: {', '.join(known)}")
    return chosen


def names(config: ml_collections.ConfigDict) -> list[str]:
    """The evaluators `config.evaluators` names (empty: every one of `EVALUATORS`), checked."""
    return _named(config, "evaluators", list(EVALUATORS)) or list(EVALUATORS)


def ood_scores(config: ml_collections.ConfigDict) -> list[str]:
    """The OOD scores `config.ood_scores` names (empty: the output scores), MSP first."""
    chosen = _named(config, "ood_scores", OOD_SCORES) or list(OUTPUT_SCORES)
    return ["msp", *(s for s in chosen if s != "msp")]


def ood_groups(config: ml_collections.ConfigDict, ood_sets: Sequence[str]) -> dict[str, str]:
    """The group (`near` or `far`) of each OOD set of the data `config` (the members' config)
    reads: the embedded sets' own (`study_data.OOD_GROUPS`), then `data.ood_groups`
    (`NAME=GROUP,...`); sets in neither have none.

    Raises:
      ValueError: an entry that is not `NAME=GROUP`, an unknown group or set.
    """
    data = config.get("data", {})
    embedded = data.get("source") == "embedded"
    groups = {n: OWN_GROUPS[n] for n in ood_sets if embedded and n in OWN_GROUPS}
    for entry in split_names(data.get("ood_groups", "")):
        name, sep, group = entry.partition("=")
        if not sep or group not in OOD_GROUPS:
            raise ValueError(f"data.ood_groups: {entry!r} is not NAME=near or NAME=far")
        if name not in ood_sets:
            raise ValueError(f"data.ood_groups names {name!r}, not an OOD set of {list(ood_sets)}")
        groups[name] = group
    return groups


def check(config: ml_collections.ConfigDict, has_validation: bool | None = None) -> None:
    """Refuses unknown evaluators or OOD scores, bad evaluation settings or OOD groups, and
    (where `has_validation` is known) evaluators that need a validation split the study lacks.

    Raises:
      ValueError: naming the field and what it accepts.
    """
    chosen = names(config)
    ood_scores(config)
    s = Settings.of(config)
    if not 0 < s.alpha < 1:
        raise ValueError(f"eval.alpha must lie in (0, 1), got {s.alpha!r}")
    if not s.raps_penalty >= 0:
        raise ValueError(f"eval.raps_penalty must be >= 0, got {s.raps_penalty!r}")
    if s.features_dtype not in ("float16", "float32"):
        raise ValueError(
            f"eval.features_dtype must be float16 or float32, got {s.features_dtype!r}"
        )
    data = config.get("data")
    if data is not None and data.get("source") == "files":
        ood_sets = list(named_specs(data.get("ood", ""), "data.ood"))
        reserved = [n for n in ood_sets if n.startswith("mean")]
        if reserved:
            raise ValueError(
                f"data.ood: {reserved}: OOD set names starting with 'mean' are the results' "
                "means over sets (`mean`, `mean_near`, `mean_far`); rename them"
            )
        ood_groups(config, ood_sets)
    elif data is not None and data.get("source") == "embedded":
        ood_groups(config, list(data.get("ood_sets", ())))
    explicit = bool(split_names(config.get("evaluators", "")))
    needing = [n for n in chosen if n in ("calibration", "conformal")]
    if has_validation is False and explicit and needing:
        raise ValueError(
            f"config.evaluators {needing} calibrate on an ID validation split, which this study "
            "has none of: give one (data.validation) or leave them out"
        )


def study(
    config: ml_collections.ConfigDict,
    sets: Sets,
    held_out: dict[str, int] | None = None,
) -> list[Evaluator]:
    """The evaluators of `config.evaluators` that the study's sets allow (calibration and
    conformal need validation data, shift needs shifted sets, OOD detection OOD sets), and the
    seen vs held-out classes where `held_out` (the classes never trained on, name -> index)
    has some.

    Raises:
      ValueError: held-out classes, but an ID test set without both seen and held-out examples.
    """
    settings = Settings.of(config)
    allowed = {
        "calibration": sets.validation is not None,
        "conformal": sets.validation is not None,
        "shift": bool(sets.shift),
    }
    evaluators = [
        EVALUATORS[name](settings, sets, config)
        for name in names(config)
        if allowed.get(name, True)
    ]
    if held_out:
        mask = np.isin(sets.test.labels, list(held_out.values()))
        if mask.all() or not mask.any():
            raise ValueError("the ID test set needs images of both seen and held-out classes")
        evaluators.append(HeldOutClasses(mask, tuple(held_out)))
    return evaluators


def sets_of(
    config: ml_collections.ConfigDict,
    data: StudyData,
    validation: Dataset | None,
    groups: dict[str, str] | None = None,
) -> Sets:
    """A study's `Sets`: its test, OOD and shifted sets with the OOD sets' `groups`, and fixed
    random subsets (seed 0) of its validation (`eval.calibration_limit`) and training
    (`eval.feature_fit_limit`) sets."""
    s = Settings.of(config)
    cut = lambda d, n: None if d is None else (subset(d, n) if n and n < len(d) else d)  # noqa: E731
    return Sets(
        test=data.test,
        ood=data.ood,
        shift=data.shift,
        validation=cut(validation, s.calibration_limit),
        train=cut(data.train, s.feature_fit_limit),
        groups=groups or {},
    )


def predictions_of(
    method: Method,
    sets: Sets,
    batch_size: int,
    needs: frozenset[str] = frozenset(),
    features_dtype: str = "float16",
    progress: bool = True,
) -> Predictions:
    """Member logits and probabilities `[N, M, C]` of `method` on the ID test set (`id_`), each
    OOD set (`ood_NAME_`) and shifted set (`shift_NAME_`), with the labels; where `needs` says
    so, on the validation subset (`val_`, "validation") and the member features `[N, M, F]`
    (`_features`, in `features_dtype`) of the training subset (`train_`), the ID test set and
    each OOD set ("features"), each from the same one pass as its logits."""
    features = "features" in needs
    if features and sets.train is None:
        raise ValueError("the feature detectors need a training set to fit on")
    out = {"labels": sets.test.labels}
    prefixed: dict[str, tuple[Dataset, bool]] = {"id": (sets.test, features)}
    prefixed |= {f"ood_{name}": (s, features) for name, s in sets.ood.items()}
    prefixed |= {f"shift_{name}": (s, False) for name, s in sets.shift.items()}
    if "validation" in needs and sets.validation is not None:
        prefixed["val"] = (sets.validation, False)
        out["val_labels"] = sets.validation.labels
    if features:
        prefixed["train"] = (sets.train, True)
        out["train_labels"] = sets.train.labels
    for prefix, (dataset, with_features) in prefixed.items():
        logits = None
        if with_features and features:
            try:
                logits, feats = predict(method, dataset, batch_size, progress, features=True)
                out[f"{prefix}_features"] = feats.astype(features_dtype)
            except NoFeaturesError:  # no features at all; the feature detectors say so
                features = False
                out = {k: v for k, v in out.items() if not k.endswith("_features")}
                out.pop("train_labels", None)
        if logits is None:
            logits = predict(method, dataset, batch_size, progress)
        out[f"{prefix}_logits"], out[f"{prefix}_probs"] = logits, to_probs(logits)
    if sets.shift:
        out["shift_labels"] = next(iter(sets.shift.values())).labels
    return out


def needs_of(evaluators: Sequence[Evaluator]) -> frozenset[str]:
    """The prediction sets `evaluators` read beyond the ID test set (`predictions_of`)."""
    return frozenset().union(*(e.needs for e in evaluators))


def score(
    evaluators: Sequence[Evaluator], predictions: Predictions, method: Method
) -> dict[str, Any]:
    """Every evaluator's results on one method's predictions, under its key."""
    return {e.key: e(predictions, method) for e in evaluators}


def evaluate_methods(
    config: ml_collections.ConfigDict,
    workdir: Workdir,
    to_evaluate: Sequence[Method],
    sets: Sets,
    evaluators: Sequence[Evaluator],
) -> tuple[dict[str, Any], list[list[str]]]:
    """Predictions (`predictions/NAME.npz`) and plots of each method, and its results from
    every evaluator; returns each method's results (`results.json`'s `methods`) and every
    evaluator's report section."""
    results: dict[str, Any] = {}
    needs = needs_of(evaluators)
    dtype = Settings.of(config).features_dtype
    for method in to_evaluate:
        with workdir.stage(f"predict {method.name}"):
            predictions = predictions_of(method, sets, config.eval.batch_size, needs, dtype)
        workdir.write_arrays(workdir.at("predictions", method=method.name), predictions)
        workdir.write_plots(functools.partial(_plots, method.name, predictions, list(sets.ood)))
        results[method.name] = score(evaluators, predictions, method)
    return results, [e.section(results) for e in evaluators]


def _plots(name: str, predictions: Predictions, ood_sets: list[str], directory: Path) -> None:
    report.reliability_plot(
        directory / f"reliability_{name}.png",
        predictions["id_probs"],
        predictions["labels"],
        f"{name}: reliability (ID test)",
    )
    p = predictions["id_probs"].astype(np.float64).mean(1)
    report.risk_coverage_plot(
        directory / f"risk_coverage_{name}.png",
        selective.risk_coverage(p.max(-1), p.argmax(-1) == predictions["labels"]),
        f"{name}: risk-coverage (ID test)",
    )
    report.ood_histogram(
        directory / f"ood_scores_{name}.png",
        metrics.ood_score(predictions["id_probs"], "msp"),
        {s: metrics.ood_score(predictions[f"ood_{s}_probs"], "msp") for s in ood_sets},
        f"{name}: MSP scores",
        num_classes=predictions["id_probs"].shape[-1],
    )
