"""The ensemble-kind table (`hydra_jax.models.kinds`) and the study's single-pass methods
(`hydra_jax.experiments.single_pass`): a kind defined and registered in this file alone, M
copies of one model (each member a perturbed copy, the ensemble their mean), runs through
`Model.init` and `apply`, training steps, `save_model` / `load_model` and a smoke study of the
generic study, with nothing else of the package changed."""

from __future__ import annotations

import csv
import dataclasses
import shutil
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import hydra_jax as hj
from configs import custom
from hydra_jax import testing
from hydra_jax.data import TokenizedSet
from hydra_jax.experiments import engine, evaluators, single_pass
from hydra_jax.models import BertConfig, kinds
from hydra_jax.models.architectures import module_of
from hydra_jax.models.outputs import ModelOutput
from hydra_jax.training import TrainSettings, fit


@dataclasses.dataclass(frozen=True)
class CopiesConfig:
    """M copies of `member`, each with its own weights, run side by side."""

    member: BertConfig
    num_members: int


def _init(config: CopiesConfig, rng: jax.Array, init_member: Any) -> dict:
    members = [init_member(config.member, k) for k in jax.random.split(rng, config.num_members)]
    return {"members": jax.tree.map(lambda *leaves: jnp.stack(leaves), *members)}


def _apply(config: CopiesConfig, params: dict, inputs: dict, rng: jax.Array | None):
    module = module_of(config.member)

    def member(weights: Any, key: jax.Array) -> jax.Array:  # [B, C]
        rngs = None if rng is None else {"dropout": key}
        out = module.apply({"params": weights}, **inputs, deterministic=rng is None, rngs=rngs)
        return out.logits

    keys = jax.random.split(jax.random.key(0) if rng is None else rng, config.num_members)
    logits = jax.vmap(member)(params["members"], keys)  # [M, B, C]
    return ModelOutput(last_hidden_state=None, logits=jnp.moveaxis(logits, 0, 1))


def _build(model: hj.Model, num_members: int, rng: jax.Array, settings: Any, num_labels: Any):
    """Member m: `model`'s weights plus N(0, settings.noise) noise of its own."""
    del num_labels
    leaves, tree = jax.tree.flatten(model.params)
    keys = jax.random.split(rng, num_members * len(leaves)).reshape(num_members, len(leaves))
    noisy = [
        jax.tree.unflatten(
            tree,
            [
                x + settings["noise"] * jax.random.normal(k, x.shape)
                for x, k in zip(leaves, ks, strict=True)
            ],
        )
        for ks in keys
    ]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *noisy)
    return hj.Model(CopiesConfig(model.config, num_members), {"members": stacked})


COPIES = kinds.Kind("copies", _init, _apply)
MEMBER = testing.bert(
    layers=2, heads=2, head_dim=3, mlp_dim=7, vocab_size=30, max_positions=16, num_labels=2
)


@pytest.fixture
def copies(monkeypatch):
    """The kind and its study method registered for one test (the tables are restored after)."""
    monkeypatch.setitem(kinds.KINDS, CopiesConfig, COPIES)
    monkeypatch.setitem(single_pass.METHODS, "copies", single_pass.SinglePass(CopiesConfig, _build))
    return COPIES


def test_an_unregistered_ensemble_config_is_refused_by_name():
    model_config = CopiesConfig(MEMBER, 2)
    with pytest.raises(TypeError, match="CopiesConfig holds members but is no registered kind"):
        hj.Model.init(model_config, jax.random.key(0))
    with pytest.raises(ValueError, match="already the kind hydra"):
        kinds.register(hj.models.HydraConfig, COPIES)


def test_a_kind_from_a_test_file_inits_applies_trains_and_saves(copies, tmp_path):
    model = hj.Model.init(CopiesConfig(MEMBER, 3), jax.random.key(1))
    ids = np.random.default_rng(0).integers(3, 30, (8, 6)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    logits = model(**batch).logits
    assert logits.shape == (8, 3, 2)  # [B, M, C], every member in one pass
    single = hj.Model(MEMBER, jax.tree.map(lambda x: x[1], model.params["members"]))
    testing.assert_close(logits[:, 1], single(**batch).logits)  # member 1 is its own model
    with pytest.raises(NotImplementedError, match="CopiesConfig model does not return"):
        model(**batch, output_attentions=True)
    data = TokenizedSet(list(ids), np.arange(8) % 2)
    settings = TrainSettings(epochs=2, batch_size=4, learning_rate=1e-2, checkpoint_every=100)
    trained = fit(model, data, settings, tmp_path / "fit", trainable=hj.hydra.trainable(model))
    moved = [np.abs(np.asarray(a - b)).max() for a, b in zip(
        jax.tree.leaves(model.params), jax.tree.leaves(trained.params), strict=True)]  # fmt: skip
    assert max(moved) > 0
    hj.save_model(trained, tmp_path / "saved")
    loaded = hj.load_model(tmp_path / "saved")
    assert loaded.config == trained.config
    jax.tree.map(np.testing.assert_array_equal, loaded.params, trained.params)
    with pytest.raises(hj.ConversionError, match="no HF format for a CopiesConfig model"):
        hj.save_pretrained(trained, tmp_path / "hf")


@dataclasses.dataclass(frozen=True)
class MemberAgreement:
    """A toy evaluator: how often member 0's prediction is the ensemble's (ID test set)."""

    key: ClassVar[str] = "agreement"
    needs: ClassVar[frozenset[str]] = frozenset()

    def __call__(self, predictions: evaluators.Predictions, method: Any) -> float:
        probs = predictions.id.probs
        return float(np.mean(probs[:, 0].argmax(-1) == probs.mean(1).argmax(-1)))

    def section(self, methods: dict[str, Any]) -> list[str]:
        rows = [f"| {name} | {r[self.key]:.3f} |" for name, r in methods.items()]
        return ["", "## Member 0 agrees with the ensemble", "", "| method | rate |", "|---|---|",
                *rows]  # fmt: skip


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerows([("text", "label"), *rows])


@pytest.mark.slow
def test_a_kind_from_a_test_file_runs_through_a_smoke_study(copies, tmp_path, monkeypatch):
    """A study method named by the kind: trained by the study from member 0's starting point
    with its settings (`config.copies`), saved, evaluated like every method, by the evaluators
    the config names, one of them registered from this file."""
    monkeypatch.setitem(evaluators.EVALUATORS, "agreement", lambda *_: MemberAgreement())
    checkpoint = tmp_path / "checkpoint"
    bert = testing.bert(
        layers=2, heads=2, head_dim=3, mlp_dim=7, vocab_size=30522, max_positions=40
    )
    hj.save_pretrained(hj.Model.init(bert, jax.random.key(2)), checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(hj.minilm_l6_path() / name, checkpoint / name)
    words = ["a joy", "warm", "great", "dull", "a mess", "boring", "superb", "awful"]
    rows = [(w, "good" if i % 2 == 0 else "bad") for i, w in enumerate(words * 2)]
    write_csv(tmp_path / "data.csv", rows)
    config = custom.get_config("smoke")
    config.update(model=str(checkpoint), methods="single,copies", ensemble_size=2)
    config.evaluators = "classification,ood,agreement"
    data = f"csv:{tmp_path / 'data.csv'}"
    config.data.update(train=data, test=data, ood=f"other={data}")
    config.copies = ml_collections.ConfigDict(dict(noise=0.01, train=dict(learning_rate=1e-3)))
    engine.train(config, tmp_path / "run")
    results = engine.evaluate(config, tmp_path / "run")
    assert set(results["methods"]) == {"single", "copies"}
    saved = hj.load_model(tmp_path / "run" / "efficient" / "copies")
    assert saved.config == CopiesConfig(
        hj.from_pretrained(tmp_path / "run" / "hf" / "member_0").config, 2
    )
    with np.load(tmp_path / "run" / "predictions" / "copies.npz") as npz:
        assert npz["id_logits"].shape == (16, 2, 2)  # [N, M, C]
        assert "id_features" not in npz  # the toy kind's output sets no features
        predictions = evaluators.Predictions.from_arrays(npz)
    assert results["methods"]["copies"]["agreement"] == MemberAgreement()(predictions, None)
    assert results["methods"]["single"]["agreement"] == 1.0  # one member: itself
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Member 0 agrees with the ensemble" in report
    assert 0 <= results["methods"]["copies"]["id"]["acc"] <= 1
    # Its feature detectors are left out, with the reason; the output scores are all there.
    ood = results["methods"]["copies"]["ood"]["mean"]
    assert set(ood["skipped"]) == set(evaluators.FEATURE_SCORES)
    assert "no features" in ood["skipped"]["mahalanobis"]
    assert set(ood["by_score"]) == set(evaluators.OUTPUT_SCORES)
