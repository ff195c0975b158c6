"""Dual encoders: the VisionTextDualEncoderModel converter both ways, zero-shot classifiers
(ours, and from a tiny random CLIP) against direct computations from `transformers` outputs,
and a fused zero-shot Hydra against its members run alone."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import hydra
from hydra_jax.data import TextEncoder
from hydra_jax.testing import assert_close

torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch parity skipped")
transformers = pytest.importorskip("transformers")

from hf_reference import masked_heads, to_numpy, vit_out_projections  # noqa: E402

CLASSES = ["t-shirt", "trouser", "ankle boot"]
TEMPLATES = ["a photo of a {}.", "a black and white photo of a {}."]


def tiny_dual_encoder() -> torch.nn.Module:
    """ViT (12 heads of width 2, patch 7 on 14x14 grey images) and BERT with MiniLM's vocabulary
    (so the real tokenizer drives it), random weights."""
    torch.manual_seed(5)
    vision = transformers.ViTConfig(
        hidden_size=24, num_hidden_layers=2, num_attention_heads=12, intermediate_size=20,
        image_size=14, patch_size=7, num_channels=1,
    )  # fmt: skip
    text = transformers.BertConfig(
        vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, max_position_embeddings=40,
    )  # fmt: skip
    config = transformers.VisionTextDualEncoderConfig.from_vision_text_configs(
        vision, text, projection_dim=10
    )
    model = transformers.VisionTextDualEncoderModel(config).eval()
    with torch.no_grad():
        model.logit_scale.fill_(1.7)
    return model


@pytest.fixture(scope="module")
def dual(tmp_path_factory):
    ref = tiny_dual_encoder()
    path = tmp_path_factory.mktemp("dual")
    ref.save_pretrained(path)
    encoder = TextEncoder(hj.minilm_l6_path(), max_tokens=32)
    pixels = np.random.default_rng(5).normal(size=(4, 1, 14, 14)).astype(np.float32)
    return ref, hj.from_pretrained(path), encoder, pixels


def test_dual_encoder_parity_with_transformers(dual):
    ref, ours, encoder, pixels = dual
    batch = encoder.pad(["a coat", "a pair of very old trousers", "bag"])
    vision_layers = vit_out_projections(ref.vision_model)
    text_layers = [l.attention.output.dense for l in ref.text_model.encoder.layer]
    rng = np.random.default_rng(0)
    for vision_mask, text_mask in [(None, None), ((rng.random((2, 12)) > 0.5) * 1.0,
                                                  rng.uniform(0, 1.5, (2, 2)))]:  # fmt: skip
        with (
            masked_heads(vision_layers, vision_mask),
            masked_heads(text_layers, text_mask),
            torch.no_grad(),
        ):
            expected = ref(**{k: torch.tensor(v) for k, v in batch.items()},
                           pixel_values=torch.tensor(pixels))  # fmt: skip
        out = ours(**batch, pixel_values=pixels, vision_head_mask=vision_mask,
                   text_head_mask=text_mask)  # fmt: skip
        for name in ("image_embeds", "text_embeds", "logits_per_image", "logits_per_text"):
            assert_close(getattr(out, name), to_numpy(getattr(expected, name)), err_msg=name)


def test_compacting_both_towers_equals_masking_them(dual):
    """`compact` reads where each tower sits from the architecture table (here `text_model`
    and `vision_model`), so a dual encoder compacts as CLIP does."""
    _, ours, encoder, pixels = dual
    batch = dict(encoder.pad(["a coat", "bag"]), pixel_values=pixels)
    rng = np.random.default_rng(3)
    keep = {"text": np.array([[True, False], [True, True]]), "vision": rng.random((2, 12)) > 0.5}
    small = hj.heads.compact(ours, keep)
    assert small.config.text.encoder.num_heads == (1, 2)
    assert small.config.vision.encoder.num_heads == tuple(keep["vision"].sum(1))
    masked = ours(**batch, text_head_mask=keep["text"] * 1.0, vision_head_mask=keep["vision"] * 1.0)
    out = small(**batch)
    for name in ("image_embeds", "text_embeds", "logits_per_image"):
        assert_close(getattr(out, name), getattr(masked, name), err_msg=name)
    with pytest.raises(TypeError, match=r"optional entries \['text', 'vision'\]"):
        hj.heads.compact(ours, keep["text"])


def test_dual_encoder_exports_what_transformers_loads(dual, tmp_path):
    _, ours, encoder, pixels = dual
    changed = hj.Model(ours.config, jax.tree.map(lambda x: x * 1.01, ours.params))
    hj.save_pretrained(changed, tmp_path)
    again = transformers.VisionTextDualEncoderModel.from_pretrained(tmp_path).eval()
    batch = encoder.pad(["a dress", "sneakers"])
    with torch.no_grad():
        expected = again(**{k: torch.tensor(v) for k, v in batch.items()},
                         pixel_values=torch.tensor(pixels))  # fmt: skip
    out = changed(**batch, pixel_values=pixels)
    assert_close(out.logits_per_image, to_numpy(expected.logits_per_image))
    assert hj.from_pretrained(tmp_path).config == ours.config


def test_dual_encoder_converter_refuses_other_towers(dual, tmp_path):
    ref, *_ = dual
    ref.save_pretrained(tmp_path)
    config = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(config.replace('"model_type": "vit"',
                                                         '"model_type": "deit"'))  # fmt: skip
    with pytest.raises(hj.ConversionError, match=r"vision_config\.model_type is 'deit'"):
        hj.from_pretrained(tmp_path)


def direct_zero_shot(ref, tokenize, pixels: np.ndarray, clip: bool = False) -> np.ndarray:
    """Zero-shot logits from `transformers` outputs, computed the textbook way."""
    texts = [t.format(c) for c in CLASSES for t in TEMPLATES]
    batch = tokenize(texts)
    if clip:
        batch = {k: v for k, v in batch.items() if k != "token_type_ids"}
    with torch.no_grad():
        out = ref(**{k: torch.tensor(v) for k, v in batch.items()},
                  pixel_values=torch.tensor(pixels))  # fmt: skip
    text = to_numpy(out.text_embeds).reshape(len(CLASSES), len(TEMPLATES), -1).mean(1)
    text /= np.linalg.norm(text, axis=-1, keepdims=True)
    return np.exp(ref.logit_scale.item()) * to_numpy(out.image_embeds) @ text.T


def test_zero_shot_logits_equal_a_direct_computation(dual):
    ref, ours, encoder, pixels = dual
    classifier = hj.zero_shot(ours, CLASSES, TEMPLATES, encoder.pad)
    assert_close(classifier(pixel_values=pixels).logits, direct_zero_shot(ref, encoder.pad, pixels))


def test_zero_shot_on_a_tiny_random_clip(tmp_path):
    torch.manual_seed(7)
    cfg = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=28, max_position_embeddings=32, eos_token_id=102, bos_token_id=101,
            pad_token_id=0,
        ),  # MiniLM's tokenizer: [SEP] (102) closes every prompt, the EOS CLIP pools
        vision_config=dict(hidden_size=18, num_hidden_layers=2, num_attention_heads=3,
                           intermediate_size=30, image_size=14, patch_size=7, num_channels=1),
        projection_dim=12,
    )  # fmt: skip
    ref = transformers.CLIPModel(cfg).eval()
    ref.save_pretrained(tmp_path)
    encoder = TextEncoder(hj.minilm_l6_path(), max_tokens=32)
    pixels = np.random.default_rng(7).normal(size=(3, 1, 14, 14)).astype(np.float32)
    classifier = hj.zero_shot(hj.from_pretrained(tmp_path), CLASSES, TEMPLATES, encoder.pad)
    expected = direct_zero_shot(ref, encoder.pad, pixels, clip=True)
    assert_close(classifier(pixel_values=pixels).logits, expected)


def test_zero_shot_refuses_bad_templates_and_models(dual):
    _, ours, encoder, _ = dual
    with pytest.raises(ValueError, match="must contain"):
        hj.zero_shot(ours, CLASSES, ["a photo"], encoder.pad)
    with pytest.raises(ValueError, match="class_names must be a list of strings, got the one"):
        hj.zero_shot(ours, "shirt", TEMPLATES, encoder.pad)  # would be 5 classes: s, h, i, ...
    with pytest.raises(ValueError, match=r"templates must be a list of strings"):
        hj.zero_shot(ours, CLASSES, "a photo of a {}.", encoder.pad)
    with pytest.raises(ValueError, match=r"distinct; \['shirt'\] appear more than once"):
        hj.zero_shot(ours, ["shirt", "coat", "shirt"], TEMPLATES, encoder.pad)
    with pytest.raises(TypeError, match="CLIP model or a dual encoder"):
        hj.zero_shot(hj.vision_tower(ours), CLASSES, TEMPLATES, encoder.pad)


def test_fused_zero_shot_hydra_equals_members_run_alone(dual):
    _, ours, encoder, pixels = dual
    classifier = hj.zero_shot(ours, CLASSES, TEMPLATES, encoder.pad)
    rng = np.random.default_rng(1)
    sets = hydra.stratified_head_sets(rng.random((2, 12)), 3)
    members = hydra.members_from(classifier, sets)
    fused = hydra.fuse(members)
    logits = np.asarray(fused(pixel_values=pixels).logits)  # [B, M, C]
    assert logits.shape == (4, 3, len(CLASSES))
    for m, member in enumerate(members):
        assert_close(logits[:, m], member(pixel_values=pixels).logits)
        masked = classifier(pixel_values=pixels, head_mask=sets[m].astype(np.float32)).logits
        assert_close(logits[:, m], masked)
