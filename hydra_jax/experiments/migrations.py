"""Older workdirs' recorded configs, read as today's: the config schema and its migrations.

A run's `config.json` records `schema`, the version of the config layout the code that wrote it
used (`SCHEMA` now). A recorded config of version v is read through `MIGRATIONS[v:]` in order:
each rewrites the flat keys (`{"a.b": value}`) of one version into the next one's, with the
values that reproduce the old run, so that `workdir.config_differences` compares like with
like. A config without `schema` predates it: version 0. A change of the config layout that
would make an existing run differ from its own config appends one migration here, with a test
of the old workdir it upgrades (`tests/test_workdir.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Flat = dict[str, Any]
SCHEMA_KEY = "schema"


def _engine_studies(before: Flat, now: Flat) -> Flat:
    """0 -> 1: the studies became configs of the study engine. A recorded `experiment` (gone)
    names the study's kind; a kind's settings that moved are read under their new keys, and the
    keys that now say what the study does take the values that reproduce it."""
    del now
    kinds: dict[str, tuple[dict[str, str], Flat]] = {
        "pruning": (
            {k: f"pruning_curves.{k}" for k in ("ratios", "criteria", "random_seeds", "alphas")},
            {"methods": [], "analyses": ["pruning_curves"]},
        ),
        "ablations": (
            {"sizes": "ablations.sizes", "strategies": "ablations.strategies"},
            {"methods": [], "analyses": ["ablations"]},
        ),
        "zero_shot": (
            {"templates": "zero_shot.templates", "held_out": "zero_shot.held_out"},
            {"zero_shot.enabled": True},
        ),
    }
    before = dict(before)
    moved, implied = kinds.get(before.pop("experiment", ""), ({}, {}))
    return {moved.get(k, k): v for k, v in before.items()} | implied


def _renamed_keys(before: Flat, now: Flat) -> Flat:
    """1 -> 2: keys renamed so that a setting has one spelling in every study."""
    del now
    renamed = {
        "eval_batch_size": "eval.batch_size",
        "ood_limit": "data.ood_limit",
        "train_limit": "data.train_limit",
        "eval_limit": "data.eval_limit",
    }
    return {renamed.get(k, k): v for k, v in before.items()}


def _analyses(before: Flat, now: Flat) -> Flat:
    """2 -> 3: the generic study gained `analyses` and their settings. A run recorded without
    `analyses` ran none, so whatever those settings are now reproduces it."""
    if "analyses" in before:
        return before
    settings = ("pruning_curves.", "ablations.", "calibration_seed")
    return {k: v for k, v in now.items() if k.startswith(settings)} | before


def _added_keys(before: Flat, now: Flat) -> Flat:
    """3 -> 4: keys added with the value that reproduces the runs recorded before them."""
    added = {"eval.dtype": "float32", "zero_shot.held_out": [], "analyses": ""}
    return before | {k: v for k, v in added.items() if k in now and k not in before}


def _hies_alphas_default(before: Flat, now: Flat) -> Flat:
    """4 -> 5: the generic study's `hies_alphas` default became empty (evenly spaced for any
    number of members) instead of (0.25, 0.5, 0.75): those are the 3 members' evenly spaced
    alphas, and with another number of members a run could not use them (HIES was refused)."""
    if now.get("hies_alphas") == [] and before.get("hies_alphas") == [0.25, 0.5, 0.75]:
        return before | {"hies_alphas": []}
    return before


def _explicit_sources(before: Flat, now: Flat) -> Flat:
    """5 -> 6: where the members and the data come from became explicit fields, read from what
    the config's shape said: members from `base_workdir` where it names one, trained from scratch
    where `model` is an architecture (a group of settings), else fine-tuned from a checkpoint;
    the embedded sets where `data.id_set` names one, else the user's files."""
    del now
    added: Flat = {}
    if "members_from" not in before:
        scratch = any(k.startswith("model.") for k in before)
        added["members_from"] = (
            "workdir" if before.get("base_workdir") else "scratch" if scratch else "checkpoint"
        )
    reads_data = "data.id_set" in before or "data.train" in before
    if reads_data and "data.source" not in before:
        added["data.source"] = "embedded" if "data.id_set" in before else "files"
    return before | added


def _evaluation_settings(before: Flat, now: Flat) -> Flat:
    """6 -> 7: the evaluation became declared (`evaluators`, `ood_scores`, `eval.alpha`, ...,
    `data.ood_groups`). They change nothing a run trained, and `evaluate.py` recomputes every
    result under the settings it is given, so a run recorded without them takes today's."""
    added = ("evaluators", "ood_scores", "data.ood_groups")
    added += tuple(f"eval.{name}" for name in _EVALUATION_FIELDS)
    return {k: v for k, v in now.items() if k in added and k not in before} | before


def _image_streams(before: Flat, now: Flat) -> Flat:
    """7 -> 8: the generic study gained `data.skip_bad_images` (and the cosmetic `data.cache`).
    A run recorded before it stopped at an image it could not decode: False reproduces it."""
    if "data.train" in before and "data.skip_bad_images" in now:
        return {"data.skip_bad_images": False} | before
    return before


def _covariance_and_shift(before: Flat, now: Flat) -> Flat:
    """8 -> 9: the Mahalanobis detectors' covariance became a setting (`eval.covariance`; a run
    recorded before it inverted the estimate, `pinv`), and the generic study gained shifted test
    sets (`data.shift`; none before). Neither changes what a run trained."""
    added = {"eval.covariance": "pinv", "data.shift": ""}
    return {k: v for k, v in added.items() if k in now and k not in before} | before


_EVALUATION_FIELDS = (
    "alpha",
    "raps_penalty",
    "raps_k",
    "knn_k",
    "vim_dim",
    "feature_fit_limit",
    "calibration_limit",
    "features_dtype",
)


# MIGRATIONS[v] reads a config of schema v as one of schema v + 1.
MIGRATIONS: tuple[Callable[[Flat, Flat], Flat], ...] = (
    _engine_studies,
    _renamed_keys,
    _analyses,
    _added_keys,
    _hies_alphas_default,
    _explicit_sources,
    _evaluation_settings,
    _image_streams,
    _covariance_and_shift,
)
SCHEMA = len(MIGRATIONS)  # the version this code writes


def upgrade(recorded: Flat, now: Flat | None = None) -> Flat:
    """The flat `recorded` config (its `schema` key included, or none: version 0) as a config
    of `SCHEMA`, without the `schema` key; `now` (the config it is compared with, flat) gives the
    settings an old run did not have and did not use."""
    recorded = dict(recorded)
    version = recorded.pop(SCHEMA_KEY, 0)
    if not isinstance(version, int) or not 0 <= version <= SCHEMA:
        raise ValueError(
            f"config.json has schema {version!r}; this hydra_jax reads schemas 0 to {SCHEMA}: "
            "a newer hydra_jax wrote it"
        )
    for migrate in MIGRATIONS[version:]:
        recorded = migrate(recorded, now or {})
    return recorded
