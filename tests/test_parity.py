"""Our models equal `transformers` PyTorch models (fp32, max abs diff <= 1e-5)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import testing

torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch parity skipped")
transformers = pytest.importorskip("transformers")

from hf_reference import masked_heads, to_numpy, vit_out_projections  # noqa: E402

pytestmark = pytest.mark.torch


def head_masks(L: int, N: int) -> list[np.ndarray | None]:
    """No mask, a binary mask that empties one layer, and a fractional mask."""
    rng = np.random.default_rng(L * 100 + N)
    binary = (rng.random((L, N)) > 0.4).astype(np.float32)
    binary[0] = 0.0  # a layer that loses every head
    binary[-1, 0] = 1.0
    return [None, binary, rng.uniform(0.0, 1.5, (L, N)).astype(np.float32)]


def padded_tokens(rng: np.random.Generator, B: int, T: int, V: int) -> tuple:
    ids = rng.integers(3, V, (B, T))
    lengths = np.array([T, T - 2, 3][:B])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    return ids * mask, mask


def save(model: torch.nn.Module, path) -> hj.Model:
    model.save_pretrained(path)
    return hj.from_pretrained(path)


def assert_close(ours, theirs, what: str) -> None:
    """XLA's program and PyTorch's kernels: equal within 1e-5 of the output's scale."""
    testing.assert_close(ours, theirs, rtol=testing.PARITY_RTOL, err_msg=what)


# ----------------------------------------------------------------------------- BERT


BERT = dict(
    vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
    intermediate_size=40, max_position_embeddings=16, type_vocab_size=2,
    attn_implementation="eager",
)  # fmt: skip


@pytest.fixture(scope="module")
def bert_pair(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**BERT, num_labels=4)
    ref = transformers.BertForSequenceClassification(cfg).eval()
    return ref, save(ref, tmp_path_factory.mktemp("bert_cls"))


@pytest.fixture(scope="module")
def bert_batch():
    rng = np.random.default_rng(0)
    ids, mask = padded_tokens(rng, 3, 7, BERT["vocab_size"])
    types = (np.arange(7)[None] >= 4).astype(np.int64) * mask
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


@pytest.mark.parametrize("mask_index", [0, 1, 2])
def test_bert_classifier_parity(bert_pair, bert_batch, mask_index):
    ref, ours = bert_pair
    mask = head_masks(2, 3)[mask_index]
    layers = ref.bert.encoder.layer
    with masked_heads([l.attention.output.dense for l in layers], mask), torch.no_grad():
        expected = ref(
            **{k: torch.tensor(v) for k, v in bert_batch.items()}, output_attentions=True
        )
        hidden = ref.bert(**{k: torch.tensor(v) for k, v in bert_batch.items()})
    out = ours(**bert_batch, head_mask=mask, output_attentions=True)
    assert_close(out.logits, to_numpy(expected.logits), "logits")
    assert_close(out.last_hidden_state, to_numpy(hidden.last_hidden_state), "last_hidden_state")
    assert_close(out.pooler_output, to_numpy(hidden.pooler_output), "pooler_output")
    attentions = np.stack([to_numpy(a) for a in expected.attentions])
    assert_close(out.attentions, attentions, "attentions")


def test_bert_model_parity(tmp_path):
    torch.manual_seed(1)
    ref = transformers.BertModel(transformers.BertConfig(**BERT)).eval()
    ours = save(ref, tmp_path)
    assert ours.config.num_labels == 0 and ours.config.pooler
    rng = np.random.default_rng(1)
    ids, mask = padded_tokens(rng, 3, 6, BERT["vocab_size"])
    for head_mask in head_masks(2, 3):
        projections = [l.attention.output.dense for l in ref.encoder.layer]
        with masked_heads(projections, head_mask), torch.no_grad():
            expected = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        out = ours(input_ids=ids, attention_mask=mask, head_mask=head_mask)
        assert_close(out.last_hidden_state, to_numpy(expected.last_hidden_state), "hidden")
        assert_close(out.pooler_output, to_numpy(expected.pooler_output), "pooler")


def test_bert_bin_checkpoint_equals_safetensors(bert_pair, tmp_path):
    ref, from_safetensors = bert_pair
    # transformers 5 only writes safetensors: write the legacy format as older versions did.
    ref.config.save_pretrained(tmp_path)
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    from_bin = hj.from_pretrained(tmp_path)
    assert from_bin.config == from_safetensors.config
    leaves = [jax.tree.leaves(m.params) for m in (from_bin, from_safetensors)]
    assert len(leaves[0]) == len(leaves[1])
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- ViT


VIT = dict(
    hidden_size=20, num_hidden_layers=3, num_attention_heads=4, intermediate_size=36,
    image_size=12, patch_size=4, num_channels=3, attn_implementation="eager",
)  # fmt: skip


@pytest.fixture(scope="module")
def vit_pixels():
    return np.random.default_rng(2).normal(size=(2, 3, 12, 12)).astype(np.float32)


@pytest.mark.parametrize("classifier", [False, True])
def test_vit_parity(tmp_path, vit_pixels, classifier):
    torch.manual_seed(2)
    if classifier:
        ref = transformers.ViTForImageClassification(transformers.ViTConfig(**VIT, num_labels=5))
        backbone = ref.vit
    else:
        ref = backbone = transformers.ViTModel(transformers.ViTConfig(**VIT))
    ref.eval()
    ours = save(ref, tmp_path)
    # transformers 5 renamed ViT modules (it still saves the legacy tensor names).
    projections = vit_out_projections(backbone)
    for head_mask in head_masks(3, 4):
        with masked_heads(projections, head_mask), torch.no_grad():
            expected = ref(pixel_values=torch.tensor(vit_pixels), output_attentions=True)
        out = ours(pixel_values=vit_pixels, head_mask=head_mask, output_attentions=True)
        attentions = np.stack([to_numpy(a) for a in expected.attentions])
        assert_close(out.attentions, attentions, "attentions")
        if classifier:
            assert_close(out.logits, to_numpy(expected.logits), "logits")
        else:
            assert_close(out.last_hidden_state, to_numpy(expected.last_hidden_state), "hidden")
            assert_close(out.pooler_output, to_numpy(expected.pooler_output), "pooler")


# ----------------------------------------------------------------------------- CLIP


def test_clip_parity(tmp_path):
    torch.manual_seed(3)
    cfg = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=28, max_position_embeddings=11, eos_token_id=59, bos_token_id=1,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=18, num_hidden_layers=2, num_attention_heads=3, intermediate_size=30,
            image_size=10, patch_size=5,
        ),
        projection_dim=12,
        attn_implementation="eager",
    )  # fmt: skip
    ref = transformers.CLIPModel(cfg).eval()
    ours = save(ref, tmp_path)
    rng = np.random.default_rng(3)
    ids, mask = padded_tokens(rng, 3, 9, 58)
    ids[np.arange(3), mask.sum(1) - 1] = 59  # EOS closes every sentence before the padding
    pixels = rng.normal(size=(2, 3, 10, 10)).astype(np.float32)
    text_layers = [l.self_attn.out_proj for l in ref.text_model.encoder.layers]
    vision_layers = [l.self_attn.out_proj for l in ref.vision_model.encoder.layers]
    for text_mask, vision_mask in zip(head_masks(2, 2), head_masks(2, 3), strict=True):
        with (
            masked_heads(text_layers, text_mask),
            masked_heads(vision_layers, vision_mask),
            torch.no_grad(),
        ):
            expected = ref(
                input_ids=torch.tensor(ids),
                attention_mask=torch.tensor(mask),
                pixel_values=torch.tensor(pixels),
            )
        out = ours(
            input_ids=ids,
            attention_mask=mask,
            pixel_values=pixels,
            text_head_mask=text_mask,
            vision_head_mask=vision_mask,
        )
        assert_close(out.image_embeds, to_numpy(expected.image_embeds), "image_embeds")
        assert_close(out.text_embeds, to_numpy(expected.text_embeds), "text_embeds")
        assert_close(out.logits_per_image, to_numpy(expected.logits_per_image), "per_image")
        assert_close(out.logits_per_text, to_numpy(expected.logits_per_text), "per_text")
        assert_close(
            out.vision_model_output.last_hidden_state,
            to_numpy(expected.vision_model_output.last_hidden_state),
            "vision hidden",
        )


# ----------------------------------------------------------------------------- real MiniLM


SENTENCES = [
    "A gripping, beautifully acted film.",
    "The plot meanders for two hours and never finds a reason to exist, which is a shame.",
    "Dull.",
    "Funny, warm and surprisingly wise about growing up in a small town.",
]


def test_minilm_real_checkpoint_parity():
    path = hj.minilm_l6_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="np")
    assert len(set(batch["attention_mask"].sum(1))) == len(SENTENCES)  # all lengths differ
    ref = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    ours = hj.from_pretrained(path)
    with torch.no_grad():
        expected = ref(**{k: torch.tensor(v) for k, v in batch.items()})
    out = ours(**dict(batch))
    # Compared on real tokens. At padding positions (states nothing downstream reads) the fp32
    # reference itself is off its own float64 run by 1.8e-5, so 1e-5 would test noise there.
    valid = batch["attention_mask"].astype(bool)
    hidden, expected_hidden = (
        np.asarray(out.last_hidden_state),
        to_numpy(expected.last_hidden_state),
    )
    assert_close(hidden[valid], expected_hidden[valid], "MiniLM hidden")
    np.testing.assert_allclose(hidden, expected_hidden, atol=1e-4)


# ----------------------------------------------------------------------------- export


def test_exported_models_load_in_transformers(tmp_path):
    bert = hj.Model.init(
        hj.models.BertConfig(
            testing.encoder(layers=2, heads=2, head_dim=6, mlp_dim=20),
            vocab_size=30, max_positions=10, type_vocab_size=2, num_labels=3,
        ),
        jax.random.key(4),
    )  # fmt: skip
    vit = hj.Model.init(
        testing.vit(layers=2, heads=3, head_dim=5, mlp_dim=22, layer_norm_eps=1e-6, num_labels=2),
        jax.random.key(5),
    )  # fmt: skip
    ids = np.random.default_rng(4).integers(0, 30, (2, 5))
    pixels = np.random.default_rng(5).normal(size=(2, 3, 8, 8)).astype(np.float32)
    for model, cls, batch in [
        (bert, transformers.BertForSequenceClassification, dict(input_ids=ids)),
        (vit, transformers.ViTForImageClassification, dict(pixel_values=pixels)),
    ]:
        directory = tmp_path / cls.__name__
        hj.save_pretrained(model, directory)
        ref = cls.from_pretrained(directory).eval()
        with torch.no_grad():
            expected = ref(**{k: torch.tensor(v) for k, v in batch.items()})
        assert_close(model(**batch).logits, to_numpy(expected.logits), cls.__name__)
        reloaded = hj.from_pretrained(directory)
        assert reloaded.config == model.config


def test_compacted_model_exported_with_zero_heads_loads_in_transformers(
    bert_pair, bert_batch, tmp_path
):
    _, ours = bert_pair
    keep = np.array([[True, False, True], [False, False, False]])  # layer 1 loses every head
    small = hj.heads.compact(ours, keep)
    hj.save_pretrained(hj.heads.expand_to_full(small), tmp_path)
    ref = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = ref(**{k: torch.tensor(v) for k, v in bert_batch.items()}).logits
    assert_close(small(**bert_batch).logits, to_numpy(expected), "compacted export")
