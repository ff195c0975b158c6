"""The methods a study evaluates, by name: one registry.

Each method is built from what a train stage left (`Trained`): the published member classifiers
(`hf/member_M`), the saved fused Hydras and pruned members (`fused/S`, `pruned/S`) and the
efficient ensembles (`efficient/KIND`: `batch_ensemble`, `lora_ensemble`, `packed_ensemble`,
`mimo`: every method of `single_pass.METHODS`). A new method is one function
here and one line of `BUILDERS` (a new single-pass ensemble is an entry there): it returns a
`Method`, a forward to `[B, M, C]` logits and its weights, and the prediction loop, metrics,
costs and reports treat it like every other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_collections

from hydra_jax.convert import from_pretrained
from hydra_jax.convert.native import CONFIG_FILE, load_model
from hydra_jax.ensembles import STRATEGIES, baselines
from hydra_jax.evaluation import Method
from hydra_jax.experiments import single_pass
from hydra_jax.experiments.artefacts import hf_dir, saved_method, zero_shot_dir
from hydra_jax.experiments.workdir import Workdir, WorkdirError, split_names
from hydra_jax.models import Model, with_dtype


@dataclasses.dataclass
class Trained:
    """Where a study's trained models are: `members` holds the published classifiers, trained
    under `members_config` (its `ensemble_size` and `mc_dropout_samples` apply); `hydras` holds
    the saved Hydras and pruned members. Methods compute in `dtype`."""

    members: Workdir
    members_config: ml_collections.ConfigDict
    hydras: Workdir
    dtype: str = "float32"
    _loaded: dict[int, Model] = dataclasses.field(default_factory=dict, repr=False)

    def member(self, index: int) -> Model:
        """Published member `index` (read once), computing in `dtype`; member 0 of a zero-shot
        study is its saved zero-shot classifier."""
        zero_shot = zero_shot_dir(self.members.path)
        if index == 0 and (zero_shot / CONFIG_FILE).is_file() and index not in self._loaded:
            self._loaded[index] = with_dtype(load_model(zero_shot), self.dtype)
        if index not in self._loaded:
            path = hf_dir(self.members.path, index)
            if not (path / "config.json").is_file():
                raise WorkdirError(
                    f"{path} holds no published classifier of member {index}: run train.py "
                    f"with --workdir {self.members} (and its recorded config) to the end first"
                )
            self._loaded[index] = with_dtype(from_pretrained(path), self.dtype)
        return self._loaded[index]

    def saved(self, kind: str, strategy: str) -> Path:
        """The saved `fused` Hydra or `pruned` member 0 of `strategy` (in `hydras`), or the
        `efficient` ensemble `strategy` (in `members`: `batch_ensemble`, `lora_ensemble`,
        `packed_ensemble`, `mimo`)."""
        workdir = self.members if kind == "efficient" else self.hydras
        where = {"fused": "hydra", "pruned": "pruned", "efficient": "efficient"}[kind]
        path = workdir.at(where, strategy=strategy, kind=strategy)
        if not (path / CONFIG_FILE).is_file():
            what = {
                "fused": "a fused Hydra of strategy",
                "pruned": "a pruned member of strategy",
                "efficient": "the ensemble",
            }[kind]
            raise WorkdirError(
                f"{path} holds no {what} {strategy!r}: run train.py with a config whose methods "
                f"or strategies name it, and --workdir {workdir}, first"
            )
        return path


def single(name: str, trained: Trained) -> Method:
    model = trained.member(0)
    features = baselines.single(model, baselines.with_features)
    return Method(name, baselines.single(model), model.params, features=features)


def deep_ensemble(name: str, trained: Trained) -> Method:
    models = [trained.member(m) for m in range(trained.members_config.ensemble_size)]
    forward, weights = baselines.deep_ensemble(models[0]), baselines.stack(models)
    features = baselines.deep_ensemble(models[0], baselines.with_features)
    return Method(name, forward, weights, stacked=True, features=features)


def mc_dropout(name: str, trained: Trained) -> Method:
    model, samples = trained.member(0), trained.members_config.mc_dropout_samples
    forward = baselines.mc_dropout(model, samples)
    features = baselines.mc_dropout(model, samples, read=baselines.with_features)
    return Method(name, forward, model.params, loop_trips=samples, features=features)


def hydra(name: str, trained: Trained) -> Method:
    """`hydra_S`: the fused Hydra of strategy S."""
    return saved_method(name, trained.saved("fused", name.split("_", 1)[1]), trained.dtype)


def pruned(name: str, trained: Trained) -> Method:
    """`pruned_S`: member 0 of strategy S's Hydra alone (one model at the members' ratio)."""
    return saved_method(name, trained.saved("pruned", name.split("_", 1)[1]), trained.dtype)


def efficient(name: str, trained: Trained) -> Method:
    """A single-pass ensemble (`batch_ensemble`, `lora_ensemble`, `packed_ensemble`, `mimo`, any
    method of `single_pass.METHODS`): the one the members' train stage saved."""
    return saved_method(name, trained.saved("efficient", name), trained.dtype)


BUILDERS: dict[str, Callable[[str, Trained], Method]] = {
    "single": single,
    "deep_ensemble": deep_ensemble,
    "mc_dropout": mc_dropout,
    **{f"hydra_{s}": hydra for s in STRATEGIES},
    **{f"pruned_{s}": pruned for s in STRATEGIES},
}  # and each single-pass ensemble kind's method (`builders`)
# The methods that are members of a baselines run, not Hydra artefacts.
MEMBER_METHODS = ("single", "deep_ensemble", "mc_dropout")


def builders() -> dict[str, Callable[[str, Trained], Method]]:
    """Every method by name: `BUILDERS` and the single-pass ensembles (`single_pass.METHODS`)."""
    return {**BUILDERS, **dict.fromkeys(single_pass.METHODS, efficient)}


def check_names(names: Sequence[str] | str, empty: bool = False) -> list[str]:
    """`names` (`split_names`) if every one is a known method; none only if `empty` (a study
    whose work is all analyses)."""
    names = split_names(names)
    known = builders()
    unknown = [n for n in names if n not in known]
    if (not names and not empty) or unknown:
        what = unknown or "no methods (and no analyses)"
        raise ValueError(f"config.methods: {what}; known: {', '.join(sorted(known))}")
    return names


def strategies(config: ml_collections.ConfigDict) -> list[str]:
    """The member strategies a study builds: `config.strategies` (where it lists them), then
    those its `hydra_S` / `pruned_S` methods name, in order, each once."""
    out = list(config.get("strategies", ()))
    for name in check_names(config.methods, empty=True):
        prefix, _, strategy = name.partition("_")
        if prefix in ("hydra", "pruned") and strategy not in out:
            out.append(strategy)
    return out


def build(names: Sequence[str] | str, trained: Trained) -> list[Method]:
    """The methods `names`, in order, from `trained`."""
    known = builders()
    return [known[name](name, trained) for name in check_names(names)]
