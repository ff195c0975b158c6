"""The zero-shot study on synthetic images: a tiny ViT trained against the real, locked MiniLM
text tower, published as a VisionTextDualEncoderModel, circuits and Taylor sets from seen
classes, fused with no training; and the locked-text contrastive loss against a hand
computation."""

from __future__ import annotations

import json

import chex
import jax
import numpy as np
import pytest

import hydra_jax as hj
from configs import zero_shot_fmnist
from hydra_jax import metrics, testing
from hydra_jax.evaluation import seeds
from hydra_jax.experiments import dual_encoder, engine, study_data
from hydra_jax.training import locked_text_contrastive_loss

pytestmark = pytest.mark.slow  # studies end to end, meshes, several processes


@pytest.fixture(scope="module")
def run(synthetic_image_dir, tmp_path_factory):
    config = zero_shot_fmnist.get_config("smoke")
    config.data_dir = str(synthetic_image_dir)
    workdir = tmp_path_factory.mktemp("zero_shot")
    engine.train(config, workdir)
    return config, workdir, engine.evaluate(config, workdir)


def test_text_tower_stays_locked_and_the_rest_trains(run):
    config, workdir, _ = run
    published = hj.from_pretrained(dual_encoder.hf_dir(workdir))
    initial = dual_encoder.initial_model(config)
    chex.assert_trees_all_equal(published.params["text_model"], initial.params["text_model"])
    for name in ("vision_model", "visual_projection", "text_projection"):
        moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), published.params[name],
                             initial.params[name])  # fmt: skip
        assert max(jax.tree.leaves(moved)) > 1e-3, name
    for name in ("tokenizer.json", "preprocessor_config.json"):
        assert (dual_encoder.hf_dir(workdir) / name).is_file()


def test_head_sets_keep_a_third_of_each_layer(run):
    _, workdir, _ = run
    for sets in json.loads((workdir / "head_sets.json").read_text()).values():
        sets = np.array(sets)
        assert sets.shape == (3, 2, 6) and (sets.sum(-1) == 2).all()


def test_zero_shot_metrics_are_recomputable(run):
    config, workdir, results = run
    names = study_data.CLASS_NAMES["fashion_mnist"]
    held_out = np.isin(np.arange(10), [names.index(n) for n in config.zero_shot.held_out])
    for name in config.methods:
        with np.load(workdir / "predictions" / f"{name}.npz") as npz:
            probs, labels = npz["id_probs"], npz["labels"]
        zs = results["methods"][name]["zero_shot"]
        rows = held_out[labels]
        assert zs["held_out"] == metrics.classification(probs[rows], labels[rows])
        assert zs["misclassification"] == metrics.misclassification(probs, labels)
    assert (
        results["methods"]["hydra_circuit"]["cost"]["params"]
        < 3 * (results["methods"]["single"]["cost"]["params"])
    )
    report = (workdir / "report.md").read_text()
    assert "## Zero-shot: seen classes vs held out" in report
    assert "## Misclassification detection" in report


def test_seed_summary_carries_the_zero_shot_columns(run):
    _, _, results = run
    summary = seeds.summarize([results, results])
    single = results["methods"]["single"]["zero_shot"]
    assert summary["single"]["held-out acc %"] == (100 * single["held_out"]["acc"], 0.0)
    assert summary["single"]["misclass. AUROC %"][0] == 100 * single["misclassification"]["auroc"]


def test_contrastive_loss_equals_a_hand_computation():
    rng = np.random.default_rng(0)
    vit = hj.models.ViTConfig(
        testing.encoder(layers=1, heads=2, head_dim=4, mlp_dim=16, pre_norm=True), 8, 4, 1
    )
    text = hj.models.BertConfig(testing.encoder(layers=1, heads=2, head_dim=3, mlp_dim=8),
                                vocab_size=10, max_positions=8, type_vocab_size=2)  # fmt: skip
    model = hj.Model.init(hj.models.DualEncoderConfig(vit, text, 5), jax.random.key(0))
    features = rng.normal(size=(3, 2, 6)).astype(np.float32)  # [C, P, D_text]
    batch = {"pixel_values": rng.normal(size=(4, 1, 8, 8)).astype(np.float32),
             "labels": np.array([0, 2, 0, 1])}  # fmt: skip
    key = jax.random.key(3)
    loss, accuracy = locked_text_contrastive_loss(model, features)(model.params, batch, key)
    images = np.asarray(model.apply(model.params, pixel_values=batch["pixel_values"],
                                    dropout_rng=key).image_embeds, np.float64)  # fmt: skip
    template = np.asarray(jax.random.randint(jax.random.fold_in(key, 3), (4,), 0, 2))
    kernel = np.asarray(model.params["text_projection"]["kernel"], np.float64)
    captions = features[batch["labels"], template] @ kernel
    captions = captions / np.linalg.norm(captions, axis=-1, keepdims=True)
    logits = np.exp(float(model.params["logit_scale"])) * images @ captions.T
    same = (batch["labels"][:, None] == batch["labels"][None]).astype(float)
    targets = same / same.sum(1, keepdims=True)

    def cross_entropy(z):
        log_p = (
            z
            - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
            - z.max(1, keepdims=True)
        )
        return -(targets * log_p).sum(1).mean()

    assert float(loss) == pytest.approx((cross_entropy(logits) + cross_entropy(logits.T)) / 2,
                                        rel=1e-5)  # fmt: skip
    assert float(accuracy) == pytest.approx(same[np.arange(4), logits.argmax(1)].mean())
