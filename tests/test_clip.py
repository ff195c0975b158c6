"""CLIP's export and its image classifier against `transformers` on tiny random models:
`save_pretrained` of a CLIPModel loads in `transformers` with equal outputs;
CLIPForImageClassification (the vision tower's mean patch token, a dense classifier) under head
masks, HIS against a PyTorch per-example reference, compact == masked, fused == members; and
`with_classifier` on a CLIPModel builds what `transformers` builds from its directory."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import hydra
from hydra_jax.testing import assert_close

torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch parity skipped")
transformers = pytest.importorskip("transformers")

from equivalences import assert_compact_equals_masked, assert_fused_equals_members  # noqa: E402
from hf_reference import head_importance, masked_heads, to_numpy  # noqa: E402

pytestmark = pytest.mark.torch

L, N = 2, 3  # the vision tower's layers and heads
TEXT = dict(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=14, max_position_embeddings=7, eos_token_id=39, bos_token_id=1,
            pad_token_id=0)  # fmt: skip
VISION = dict(hidden_size=15, num_hidden_layers=L, num_attention_heads=N, intermediate_size=26,
              image_size=10, patch_size=5)  # fmt: skip


def config(**options) -> transformers.CLIPConfig:
    return transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=6,
                                   attn_implementation="eager", **options)  # fmt: skip


def pixels() -> np.ndarray:
    return np.random.default_rng(4).normal(size=(3, 3, 10, 10)).astype(np.float32)


def projections(reference: torch.nn.Module) -> list[torch.nn.Module]:
    return [layer.self_attn.out_proj for layer in reference.vision_model.encoder.layers]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    torch.manual_seed(6)
    reference = transformers.CLIPModel(config()).eval()
    path = tmp_path_factory.mktemp("clip")
    reference.save_pretrained(path)
    return reference, hj.from_pretrained(path), path


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    torch.manual_seed(7)
    reference = transformers.CLIPForImageClassification(config(num_labels=4)).eval()
    path = tmp_path_factory.mktemp("clip_classifier")
    reference.save_pretrained(path)
    return reference, hj.from_pretrained(path)


def test_export_loads_in_transformers_with_equal_outputs(clip, tmp_path):
    _, ours, _ = clip
    changed = hj.Model(ours.config, jax.tree.map(lambda x: x * 1.01, ours.params))
    hj.save_pretrained(changed, tmp_path)
    reloaded = transformers.CLIPModel.from_pretrained(tmp_path).eval()
    ids = np.array([[5, 9, 12, 39], [7, 39, 0, 0]])
    mask = (np.arange(4) < np.array([[4], [2]])).astype(np.int64)
    with torch.no_grad():
        expected = reloaded(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                            pixel_values=torch.tensor(pixels()))  # fmt: skip
    out = changed(input_ids=ids, attention_mask=mask, pixel_values=pixels())
    for name in ("text_embeds", "image_embeds", "logits_per_text"):
        assert_close(getattr(out, name), to_numpy(getattr(expected, name)), err_msg=name)
    assert hj.from_pretrained(tmp_path).config == ours.config


def test_image_classifier_equals_transformers_under_head_masks(classifier):
    reference, ours = classifier
    assert ours.config.num_labels == 4 and "post_norm" not in ours.params
    rng = np.random.default_rng(2)
    binary = (rng.random((L, N)) > 0.4) * 1.0
    binary[0] = 0.0  # a layer that loses every head
    for mask in (None, binary, rng.uniform(0, 1.5, (L, N))):
        with masked_heads(projections(reference), mask), torch.no_grad():
            expected = reference(pixel_values=torch.tensor(pixels())).logits
        assert_close(ours(pixel_values=pixels(), head_mask=mask).logits, to_numpy(expected))
    labels = np.array([0, 3, 1])
    his, _ = hj.heads.his_and_entropy(ours, [{"pixel_values": pixels(), "labels": labels}])
    inputs = {"pixel_values": pixels()}
    expected = head_importance(reference, projections(reference), inputs, labels, (L, N))
    np.testing.assert_allclose(his, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_a_clip_model_becomes_an_image_classifier_as_in_transformers(clip, tmp_path):
    """`with_classifier` on a CLIPModel: its vision tower, a new classifier on the mean patch
    token; `transformers` builds the same network from the CLIPModel's directory. The export
    loads back in `transformers` and in hydra_jax."""
    _, ours, path = clip
    mine = hj.with_classifier(ours, 3, jax.random.key(0))
    assert mine.config == hj.models.CLIPClassifierConfig(ours.config.vision, 3)
    expected = transformers.CLIPForImageClassification.from_pretrained(path, num_labels=3).eval()
    head = mine.params["classifier"]
    with torch.no_grad():
        expected.classifier.weight.copy_(torch.tensor(np.asarray(head["kernel"]).T))
        expected.classifier.bias.copy_(torch.tensor(np.asarray(head["bias"])))
        logits = expected(pixel_values=torch.tensor(pixels())).logits
    assert_close(mine(pixel_values=pixels()).logits, to_numpy(logits))
    hj.save_pretrained(mine, tmp_path)
    exported = transformers.CLIPForImageClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        logits = exported(pixel_values=torch.tensor(pixels())).logits
    assert_close(mine(pixel_values=pixels()).logits, to_numpy(logits))
    assert hj.from_pretrained(tmp_path).config == mine.config


def test_compact_and_fusion_on_the_image_classifier(classifier):
    _, ours = classifier
    inputs = {"pixel_values": pixels()}
    assert_compact_equals_masked(ours, inputs, np.array([[True, False, True], [False, True, True]]))
    sets = hydra.stratified_head_sets(np.random.default_rng(1).random((L, N)), 3)
    assert_fused_equals_members(ours, inputs, sets)
