"""SigLIP against `transformers` on a tiny random SiglipModel: both towers and the sigmoid
logits under head masks, export that `transformers` loads, a zero-shot tower against a direct
computation from `transformers`' outputs, HIS on it against a PyTorch per-example reference,
compact == masked, a fused zero-shot Hydra == its members, bf16 and our own format."""

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

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # many compiled programs

CLASSES = ["t-shirt", "trouser", "ankle boot"]
TEMPLATES = ["a photo of a {}.", "a black and white photo of a {}."]
T = 8  # SigLIP's tokenizer pads every text to a fixed length; its embedding is the last token's
TEXT = dict(
    vocab_size=40,
    hidden_size=12,
    intermediate_size=20,
    num_hidden_layers=2,
    num_attention_heads=3,
    max_position_embeddings=T,
    bos_token_id=1,
    eos_token_id=2,
)
KEEP = np.array([[True, False, True, True], [False, True, False, True]])  # of the vision tower
SETS = hydra.stratified_head_sets(np.random.default_rng(1).random((2, 4)), 2)
VISION = dict(hidden_size=12, intermediate_size=22, num_hidden_layers=2, num_attention_heads=4,
              image_size=12, patch_size=4, num_channels=3)  # fmt: skip


def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
    """Words hashed into the vocabulary, padded with 1 to T tokens (as SigLIP pads)."""
    rows = [[3 + sum(map(ord, w)) % 37 for w in t.split()][:T] for t in texts]
    return {"input_ids": np.array([r + [1] * (T - len(r)) for r in rows], np.int64)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(4)
    config = transformers.SiglipConfig(text_config=TEXT, vision_config=VISION,
                                       attn_implementation="eager")  # fmt: skip
    reference = transformers.SiglipModel(config).eval()
    with torch.no_grad():
        reference.logit_scale.fill_(1.3)
        reference.logit_bias.fill_(-2.5)
    path = tmp_path_factory.mktemp("siglip")
    reference.save_pretrained(path)
    pixels = np.random.default_rng(3).normal(size=(4, 3, 12, 12)).astype(np.float32)
    return reference, hj.from_pretrained(path), pixels


def test_both_towers_and_sigmoid_logits_equal_transformers_under_head_masks(pair):
    reference, ours, pixels = pair
    batch = tokenize(["a coat", "a pair of very old trousers", "bag"])
    rng = np.random.default_rng(0)
    text_layers = [l.self_attn.out_proj for l in reference.text_model.encoder.layers]
    vision_layers = [l.self_attn.out_proj for l in reference.vision_model.encoder.layers]
    for text_mask, vision_mask in [(None, None), (rng.uniform(0, 1.5, (2, 3)),
                                                  (rng.random((2, 4)) > 0.4) * 1.0)]:  # fmt: skip
        with (
            masked_heads(text_layers, text_mask),
            masked_heads(vision_layers, vision_mask),
            torch.no_grad(),
        ):
            expected = reference(input_ids=torch.tensor(batch["input_ids"]),
                                 pixel_values=torch.tensor(pixels))  # fmt: skip
        out = ours(**batch, pixel_values=pixels, text_head_mask=text_mask,
                   vision_head_mask=vision_mask)  # fmt: skip
        for name in ("text_embeds", "image_embeds", "logits_per_text", "logits_per_image"):
            assert_close(getattr(out, name), to_numpy(getattr(expected, name)), err_msg=name)
        assert_close(out.vision_model_output.last_hidden_state,
                     to_numpy(expected.vision_model_output.last_hidden_state))  # fmt: skip


def test_zero_shot_tower_equals_a_direct_computation(pair):
    """logits = exp(scale) * cos(image, class) + bias, a class embedding being the normalised
    mean of its normalised prompt embeddings, all read from `transformers`' outputs."""
    reference, ours, pixels = pair
    classifier = hj.zero_shot(ours, CLASSES, TEMPLATES, tokenize)
    texts = hj.models.prompts(CLASSES, TEMPLATES)
    with torch.no_grad():
        out = reference(input_ids=torch.tensor(tokenize(texts)["input_ids"]),
                        pixel_values=torch.tensor(pixels))  # fmt: skip
    text = to_numpy(out.text_embeds).reshape(len(CLASSES), len(TEMPLATES), -1).mean(1)
    text /= np.linalg.norm(text, axis=-1, keepdims=True)
    expected = to_numpy(out.image_embeds) @ text.T * np.exp(1.3) - 2.5
    assert_close(classifier(pixel_values=pixels).logits, expected)


class ZeroShotReference(torch.nn.Module):
    """The zero-shot tower in PyTorch: `transformers`' pooled image embedding against fixed
    class embeddings, `exp(scale) * cos + bias`."""

    def __init__(self, siglip: torch.nn.Module, class_embeds: np.ndarray):
        super().__init__()
        self.siglip, self.classes = siglip, torch.tensor(np.asarray(class_embeds))

    def forward(self, pixel_values: torch.Tensor):
        image = self.siglip.vision_model(pixel_values=pixel_values).pooler_output
        image = image / image.norm(dim=-1, keepdim=True)
        classes = self.classes / self.classes.norm(dim=-1, keepdim=True)
        logits = image @ classes.T * self.siglip.logit_scale.exp() + self.siglip.logit_bias
        return transformers.modeling_outputs.SequenceClassifierOutput(logits=logits)


def test_his_equals_a_pytorch_per_example_reference(pair):
    reference, ours, pixels = pair
    classifier = hj.zero_shot(ours, CLASSES, TEMPLATES, tokenize)
    labels = np.array([0, 2, 1, 1])
    batch = {"pixel_values": pixels, "labels": labels}
    his, _ = hj.heads.his_and_entropy(classifier, [batch])
    wrapper = ZeroShotReference(reference, classifier.params["class_embeds"])
    layers = [l.self_attn.out_proj for l in reference.vision_model.encoder.layers]
    expected = head_importance(wrapper, layers, {"pixel_values": pixels}, labels, (2, 4))
    np.testing.assert_allclose(his, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_compact_fusion_bf16_and_our_format_on_the_zero_shot_tower(pair, tmp_path):
    _, ours, pixels = pair
    classifier = hj.zero_shot(ours, CLASSES, TEMPLATES, tokenize)
    inputs = {"pixel_values": pixels}
    assert_compact_equals_masked(classifier, inputs, KEEP)
    assert_fused_equals_members(classifier, inputs, SETS)
    low = hj.with_dtype(classifier, "bfloat16")(pixel_values=pixels).logits
    full = classifier(pixel_values=pixels).logits
    assert 0 < np.abs(np.asarray(low) - full).max() <= 0.05 * np.abs(full).max()
    hj.save_model(classifier, tmp_path / "tower")
    restored = hj.load_model(tmp_path / "tower")
    np.testing.assert_array_equal(restored(pixel_values=pixels).logits, full)


def test_export_loads_in_transformers_with_equal_logits(pair, tmp_path):
    _, ours, pixels = pair
    changed = hj.Model(ours.config, jax.tree.map(lambda x: x * 1.01, ours.params))
    hj.save_pretrained(changed, tmp_path)
    reloaded = transformers.SiglipModel.from_pretrained(tmp_path).eval()
    batch = tokenize(["a coat", "bag"])
    with torch.no_grad():
        expected = reloaded(input_ids=torch.tensor(batch["input_ids"]),
                            pixel_values=torch.tensor(pixels)).logits_per_text  # fmt: skip
    assert_close(changed(**batch, pixel_values=pixels).logits_per_text, to_numpy(expected))
    assert hj.from_pretrained(tmp_path).config == ours.config
    with pytest.raises(ValueError, match=r"input_ids has 9 tokens, more than the model's 8"):
        ours(input_ids=np.ones((1, 9), np.int64))


# SiglipForImageClassification: the vision tower, its final-normed tokens averaged, a dense
# classifier. Loaded from its own directory, and made from a SiglipModel by `with_classifier`.
@pytest.fixture(scope="module")
def image_classifier(pair, tmp_path_factory):
    torch.manual_seed(5)
    config = transformers.SiglipConfig(text_config=TEXT, vision_config=VISION, num_labels=5,
                                       attn_implementation="eager")  # fmt: skip
    reference = transformers.SiglipForImageClassification(config).eval()
    path = tmp_path_factory.mktemp("siglip_classifier")
    reference.save_pretrained(path)
    return reference, hj.from_pretrained(path)


def test_image_classifier_equals_transformers_under_head_masks(pair, image_classifier):
    *_, pixels = pair
    reference, ours = image_classifier
    assert ours.config.num_labels == 5 and "pool" not in ours.params
    layers = [l.self_attn.out_proj for l in reference.vision_model.encoder.layers]
    rng = np.random.default_rng(2)
    binary = (rng.random((2, 4)) > 0.4) * 1.0
    binary[0] = 0.0  # a layer that loses every head
    for mask in (None, binary, rng.uniform(0, 1.5, (2, 4))):
        with masked_heads(layers, mask), torch.no_grad():
            expected = reference(pixel_values=torch.tensor(pixels)).logits
        assert_close(ours(pixel_values=pixels, head_mask=mask).logits, to_numpy(expected))
    labels = np.array([0, 4, 1, 3])
    his, _ = hj.heads.his_and_entropy(ours, [{"pixel_values": pixels, "labels": labels}])
    expected = head_importance(reference, layers, {"pixel_values": pixels}, labels, (2, 4))
    np.testing.assert_allclose(his, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_a_siglip_model_becomes_an_image_classifier_as_in_transformers(pair, tmp_path):
    """`with_classifier` on a SiglipModel: its vision tower without the pooling head, a new
    classifier; `transformers` builds the same network from the SiglipModel's directory."""
    reference, ours, pixels = pair
    classifier = hj.with_classifier(ours, 3, jax.random.key(0))
    assert classifier.config == hj.models.SiglipClassifierConfig(ours.config.vision, 3)
    hj.save_pretrained(classifier, tmp_path / "mine")
    reference.save_pretrained(tmp_path / "siglip")
    expected = transformers.SiglipForImageClassification.from_pretrained(
        tmp_path / "siglip", num_labels=3
    )
    with torch.no_grad():
        expected.classifier.weight.copy_(
            torch.tensor(np.asarray(classifier.params["classifier"]["kernel"]).T)
        )
        expected.classifier.bias.copy_(
            torch.tensor(np.asarray(classifier.params["classifier"]["bias"]))
        )
        logits = expected.eval()(pixel_values=torch.tensor(pixels)).logits
    assert_close(classifier(pixel_values=pixels).logits, to_numpy(logits))
    exported = transformers.SiglipForImageClassification.from_pretrained(tmp_path / "mine").eval()
    with torch.no_grad():
        logits = exported(pixel_values=torch.tensor(pixels)).logits
    assert_close(classifier(pixel_values=pixels).logits, to_numpy(logits))
    assert hj.from_pretrained(tmp_path / "mine").config == classifier.config


def test_compact_and_fusion_on_the_image_classifier(pair, image_classifier):
    *_, pixels = pair
    _, ours = image_classifier
    assert_compact_equals_masked(ours, {"pixel_values": pixels}, KEEP)
    assert_fused_equals_members(ours, {"pixel_values": pixels}, SETS)
