"""DeiT (with and without its distillation head), DINOv2, and DINOv2 with registers and a
SwiGLU MLP against `transformers`, on tiny random models: logits and hidden states under head
masks (DINOv2 also at other image sizes, where it resizes its positions), export that
`transformers` loads, compact == masked, fused == members, and HIS against a PyTorch
per-example reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import testing

torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch parity skipped")
transformers = pytest.importorskip("transformers")

from hf_reference import (  # noqa: E402
    assert_outputs_close,
    head_importance,
    masked_heads,
    to_numpy,
    vit_out_projections,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # many compiled programs

L, N, K, F = 2, 3, 5, 22  # distinct: a swapped axis fails
SHAPE = dict(hidden_size=N * K, num_hidden_layers=L, num_attention_heads=N, image_size=12,
             patch_size=4, num_channels=3, attn_implementation="eager")  # fmt: skip
DEIT = transformers.DeiTConfig(**SHAPE, intermediate_size=F, num_labels=4)
DINOV2 = transformers.Dinov2Config(**SHAPE, mlp_ratio=2, layerscale_value=0.5, num_labels=4)
CLASSES = {
    "deit_teacher": (transformers.DeiTForImageClassificationWithTeacher, DEIT),
    "deit": (transformers.DeiTForImageClassification, DEIT),
    "dinov2": (transformers.Dinov2ForImageClassification, DINOV2),
    # The giant models' SwiGLU MLP (two thirds of 2 D, rounded up to 24) and 2 registers.
    "dinov2_registers": (
        transformers.Dinov2WithRegistersForImageClassification,
        transformers.Dinov2WithRegistersConfig(**SHAPE, mlp_ratio=2, layerscale_value=0.5,
                                               use_swiglu_ffn=True, num_register_tokens=2,
                                               num_labels=4),
    ),
}  # fmt: skip


def pixels(size: tuple[int, int] = (12, 12)) -> np.ndarray:
    return np.random.default_rng(9).normal(size=(3, 3, *size)).astype(np.float32)


def backbone(reference: torch.nn.Module) -> torch.nn.Module:
    for name in ("deit", "dinov2", "dinov2_with_registers"):
        if hasattr(reference, name):
            return getattr(reference, name)
    raise AttributeError(type(reference).__name__)


def projections(reference: torch.nn.Module) -> list[torch.nn.Module]:
    return vit_out_projections(backbone(reference))


def head_masks() -> list[np.ndarray | None]:
    rng = np.random.default_rng(7)
    binary = (rng.random((L, N)) > 0.4).astype(np.float32)
    binary[0] = 0.0  # a layer that loses every head
    binary[-1, 0] = 1.0
    return [None, binary, rng.uniform(0.0, 1.5, (L, N)).astype(np.float32)]


@pytest.fixture(scope="module", params=list(CLASSES))
def pair(request, tmp_path_factory):
    torch.manual_seed(11)
    cls, config = CLASSES[request.param]
    reference = cls(config).eval()
    with torch.no_grad():  # LayerScale and the heads away from their initial constants
        for name, p in reference.named_parameters():
            if "lambda1" in name or "classifier" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(path)
    return request.param, reference, hj.from_pretrained(path)


def test_logits_and_hidden_states_equal_transformers_under_head_masks(pair):
    name, reference, ours = pair
    # 64 x 64 px: 257 tokens, more than the attention's 256-row query block.
    sizes = [(12, 12), (16, 16), (12, 20), (64, 64)] if name == "dinov2" else [(12, 12)]
    for size, mask in [(s, m) for s in sizes for m in head_masks()]:
        inputs = {"pixel_values": pixels(size)}
        with masked_heads(projections(reference), mask), torch.no_grad():
            tensors = {k: torch.tensor(v) for k, v in inputs.items()}
            expected = reference(**tensors, output_attentions=True)
            hidden = backbone(reference)(**tensors).last_hidden_state
        out = ours(**inputs, head_mask=mask, output_attentions=True)
        assert_outputs_close(out, expected, hidden, f"{name} at {size}")
    if name == "dinov2_registers":  # HF resizes its positions with antialiasing: not modelled
        with pytest.raises(ValueError, match=r"takes \[B, C, H, W\] = \[B, 3, 12, 12\]"):
            ours(pixel_values=pixels((16, 16)))


def test_export_loads_in_transformers_with_equal_logits(pair, tmp_path):
    name, _, ours = pair
    hj.save_pretrained(ours, tmp_path)
    reloaded = CLASSES[name][0].from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = reloaded(pixel_values=torch.tensor(pixels())).logits
    testing.assert_close(ours(pixel_values=pixels()).logits, to_numpy(expected), err_msg=name)
    assert hj.from_pretrained(tmp_path).config == ours.config


def test_compact_equals_masked_and_fused_equals_members(pair):
    name, _, ours = pair
    inputs = {"pixel_values": pixels()}
    keep = np.array([[True, False, True], [False, True, True]])
    testing.assert_close(hj.heads.compact(ours, keep)(**inputs).logits,
                         ours(**inputs, head_mask=keep.astype(np.float32)).logits)  # fmt: skip
    sets = np.array([[[1, 0, 0], [0, 1, 0]], [[0, 1, 0], [0, 0, 1]], [[0, 0, 1], [1, 0, 0]]], bool)
    members = hj.hydra.members_from(ours, sets)
    logits = hj.hydra.fuse(members)(**inputs).logits  # [B, M, C]
    for m, member in enumerate(hj.hydra.with_shared_weights(members)):
        testing.assert_close(logits[:, m], member(**inputs).logits, err_msg=f"{name} member {m}")


def test_his_equals_a_pytorch_per_example_reference(pair):
    _name, reference, ours = pair
    images, labels = pixels(), np.array([0, 3, 1])
    his, _ = hj.heads.his_and_entropy(ours, [{"pixel_values": images, "labels": labels}])
    inputs = {"pixel_values": images}
    expected = head_importance(reference, projections(reference), inputs, labels, (L, N))
    np.testing.assert_allclose(his, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_a_new_classifier_replaces_every_head(pair):
    name, _, ours = pair
    fresh = hj.with_classifier(ours, 5, jax.random.key(0))
    assert fresh(pixel_values=pixels()).logits.shape == (3, 5)
    assert set(fresh.params) == set(ours.params), name  # the same heads, resized
