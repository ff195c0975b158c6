"""What every evaluator shares: its settings, its protocol, and the predictions it reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import ml_collections
import numpy as np

from hydra_jax.data import Dataset
from hydra_jax.evaluation import Method
from hydra_jax.experiments.workdir import split_names
from hydra_jax.metrics import detectors

OUTPUT_SCORES = ("msp", "entropy", "mi", "energy", "max_logit", "gen")  # from the outputs
FEATURE_SCORES = detectors.DETECTORS  # fitted per member on the training subset
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
    then read, so the saved arrays reproduce every number; the Mahalanobis detectors'
    covariance estimator (`covariance`: `detectors.COVARIANCES`)."""

    num_bins: int = 15
    alpha: float = 0.1
    raps_penalty: float = 0.01
    raps_k: int = 5
    knn_k: int = 50
    vim_dim: int = 0
    feature_fit_limit: int = 1000
    calibration_limit: int = 1000
    features_dtype: str = "float32"
    covariance: str = "pinv"

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


@dataclasses.dataclass(frozen=True)
class Outputs:
    """One set's member outputs, all from one pass: `logits` and `probs` `[N, M, C]`, the
    set's `labels` `[N]` (None for an OOD set) and, where asked for, member features
    `[N, M, F]`."""

    logits: np.ndarray
    probs: np.ndarray
    labels: np.ndarray | None = None
    features: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Predictions:
    """One method's outputs on the ID test set (`id`), each OOD set and shifted set by name, and
    where the evaluators need them, the validation subset and the training subset (with
    features). `arrays` and `from_arrays` convert to and from `predictions/NAME.npz`, whose
    keys are `labels`, `id_logits`, `ood_NAME_probs`, `shift_NAME_labels`, `val_logits`,
    `train_features`, ..."""

    id: Outputs
    ood: Mapping[str, Outputs] = dataclasses.field(default_factory=dict)
    shift: Mapping[str, Outputs] = dataclasses.field(default_factory=dict)
    validation: Outputs | None = None
    train: Outputs | None = None

    def prefixed(self) -> dict[str, Outputs]:
        """Every set by its prefix in the arrays: `id`, `ood_NAME`, `shift_NAME`, `val`,
        `train`."""
        sets = {"id": self.id}
        sets |= {f"ood_{name}": o for name, o in self.ood.items()}
        sets |= {f"shift_{name}": o for name, o in self.shift.items()}
        if self.validation is not None:
            sets["val"] = self.validation
        if self.train is not None:
            sets["train"] = self.train
        return sets

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of `predictions/NAME.npz`."""
        out = {"labels": self.id.labels}
        for prefix, outputs in self.prefixed().items():
            if outputs.features is not None:
                out[f"{prefix}_features"] = outputs.features
            out[f"{prefix}_logits"], out[f"{prefix}_probs"] = outputs.logits, outputs.probs
        for prefix, outputs in (("val", self.validation), ("train", self.train)):
            if outputs is not None:
                out[f"{prefix}_labels"] = outputs.labels
        for name, outputs in self.shift.items():  # each set its own (they may differ in size)
            out[f"shift_{name}_labels"] = outputs.labels
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Predictions:
        """The predictions `arrays` (the arrays of `predictions/NAME.npz`) hold."""

        def outputs(prefix: str, labels: np.ndarray | None) -> Outputs:
            return Outputs(
                arrays[f"{prefix}_logits"],
                arrays[f"{prefix}_probs"],
                labels,
                arrays.get(f"{prefix}_features"),
            )

        def named(kind: str) -> list[str]:
            start, end = f"{kind}_", "_logits"
            return [k[len(start) : -len(end)] for k in arrays if k.startswith(start) and
                    k.endswith(end)]  # fmt: skip

        def shift_labels(name: str) -> np.ndarray:  # a file may hold one array for every set
            return arrays[f"shift_{name}_labels" if f"shift_{name}_labels" in arrays else
                          "shift_labels"]  # fmt: skip

        optional = {
            p: outputs(p, arrays[f"{p}_labels"]) if f"{p}_logits" in arrays else None
            for p in ("val", "train")
        }
        return cls(
            outputs("id", arrays["labels"]),
            {n: outputs(f"ood_{n}", None) for n in named("ood")},
            {n: outputs(f"shift_{n}", shift_labels(n)) for n in named("shift")},
            optional["val"],
            optional["train"],
        )


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


class Evaluator(Protocol):
    """Called on one method's predictions, it returns that method's metrics under its `key` in
    `results.json`; `section` turns every method's results into its part of `report.md`;
    `needs` names the prediction sets it reads beyond the ID test set ("validation",
    "features")."""

    key: ClassVar[str]
    needs: ClassVar[frozenset[str]]

    def __call__(self, predictions: Predictions, method: Method | None) -> Any: ...

    def section(self, methods: dict[str, Any]) -> list[str]: ...


def chosen_names(config: ml_collections.ConfigDict, field: str, known: Sequence[str]) -> list[str]:
    """The names `config.FIELD` lists, or a ValueError naming the unknown and the known ones."""
    chosen = split_names(config.get(field, ""))
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise ValueError(f"config.{field}: unknown {unknown}; known: {', '.join(known)}")
    return chosen


def pct(x: float) -> str:
    """A fraction as a percentage with two decimals, as the report prints them."""
    return f"{100 * x:.2f}"
