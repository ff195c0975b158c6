"""TFDS builders on a synthetic source in the real format; tokenisation and batching."""

from __future__ import annotations

import numpy as np
import pytest

import hydra_jax as hj
from hydra_jax import data, testing
from hydra_jax.data import TextEncoder, TokenizedSet, epoch_batches, eval_batches, pad_batch


def test_movie_review_splits_and_labels(synthetic_data_dir):
    splits = {
        s: data.load("movie_reviews", s, synthetic_data_dir)
        for s in ("train", "validation", "test")
    }
    assert {s: len(v) for s, v in splits.items()} == {
        "train": 8005,
        "validation": 1000,
        "test": 1600,
    }
    ids = [int(i) for v in splits.values() for i in v.ids]
    assert sorted(ids) == list(range(1, 10606))  # a partition of every row
    test = splits["test"]
    labels = dict(zip(test.ids, test.labels, strict=True))
    assert all(labels[i] == (1 if int(i) <= 5152 else 0) for i in test.ids)
    # The split is the documented permutation, not TFDS's storage order.
    expected_test = np.sort(np.random.default_rng(0).permutation(10605)[:1600] + 1)
    np.testing.assert_array_equal(np.array([int(i) for i in test.ids]), expected_test)
    assert any("wonderful" in t or "moving" in t for t in test.texts)


@pytest.mark.parametrize(
    ("name", "n"), [("nyt_editorials", 60), ("tweets", 45), ("amazon_reviews", 40)]
)
def test_ood_splits(synthetic_data_dir, name, n):
    validation = data.load(name, "validation", synthetic_data_dir)
    test = data.load(name, "test", synthetic_data_dir)
    assert len(validation) == round(0.2 * n) and len(validation) + len(test) == n
    assert not set(validation.ids) & set(test.ids)
    assert np.all(test.labels == data.NO_LABEL)


def test_prepare_is_idempotent(synthetic_data_dir):
    root = data.prepare(synthetic_data_dir)
    files = sorted(root.rglob("*.array_record*"))
    stamps = [f.stat().st_mtime_ns for f in files]
    data.prepare(synthetic_data_dir)
    assert [f.stat().st_mtime_ns for f in sorted(root.rglob("*.array_record*"))] == stamps


def test_missing_source_names_the_fetch_command(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"pip download --no-deps --no-binary :all: vadersentiment==3\.3\.2"
    ):
        data.load("tweets", "test", tmp_path)


def test_unknown_set(synthetic_data_dir):
    with pytest.raises(ValueError, match="unknown sentence set 'imdb'"):
        data.load("imdb", "test", synthetic_data_dir)


def test_encoder_uses_checkpoint_tokenizer_without_its_fixed_padding():
    encoder = TextEncoder(hj.minilm_l6_path(), max_tokens=64)
    short, long = encoder(["Dull.", "word " * 200])
    assert short.tolist()[0] == 101 and short.tolist()[-1] == 102  # [CLS] ... [SEP]
    assert short.size == 4  # [CLS] dull . [SEP]: not padded to 128
    assert long.size == 64 and long[-1] == 102  # truncated to the cap, [SEP] kept
    (least,) = TextEncoder(hj.minilm_l6_path(), max_tokens=3)(["word " * 9])
    assert least.size == 3 and least[0] == 101 and least[-1] == 102  # [CLS] word [SEP]


@pytest.mark.parametrize(
    ("tokens", "labels", "message"),
    [([np.arange(1, 4)] * 5, np.arange(2), "got 5 token arrays and labels of shape \\(2,\\)"),
     ([np.arange(1, 4)] * 2, np.zeros((2, 1), int), "labels of shape \\(2, 1\\)"),
     ([np.arange(1, 4), np.array([], np.int32)], np.arange(2), "examples \\[1\\] are not"),
     ([np.ones((2, 3), np.int32)], np.arange(1), "examples \\[0\\] are not")],
)  # fmt: skip
def test_a_token_set_refuses_labels_that_do_not_match_and_empty_sequences(tokens, labels, message):
    with pytest.raises(ValueError, match=message):
        TokenizedSet(tokens, labels)


@pytest.mark.parametrize("max_tokens", [0, 1, 2, -3, 2.5])
def test_encoder_refuses_a_cap_below_its_special_tokens(max_tokens):
    """The tokenizer kept every sentence whole at 0 or 1 and emptied it at 2."""
    with pytest.raises(ValueError, match=r"max_tokens \(\[CLS\], a token, \[SEP\]\) must be an"):
        TextEncoder(hj.minilm_l6_path(), max_tokens=max_tokens)


def test_encoder_names_a_missing_fast_tokenizer(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no tokenizer.json .*save_pretrained\(DIR\)"):
        TextEncoder(tmp_path)


def test_pad_batch_pads_per_batch_to_multiple_of_16():
    tokens = [np.arange(1, 6), np.arange(1, 19)]
    batch = pad_batch(tokens, pad_id=0, batch_size=4)
    assert batch["input_ids"].shape == (4, 32)
    np.testing.assert_array_equal(batch["attention_mask"].sum(1), [5, 18, 5, 5])
    np.testing.assert_array_equal(batch["input_ids"][2], batch["input_ids"][0])
    with pytest.raises(ValueError, match="empty batch"):
        pad_batch([], pad_id=0)
    with pytest.raises(ValueError, match="all padding"):
        pad_batch([np.arange(3), np.zeros(0, np.int32)], pad_id=0)


def test_pad_batch_exact_pads_to_the_longest_or_to_length_and_refuses_longer():
    tokens = [np.arange(1, 6), np.arange(1, 19)]
    assert pad_batch(tokens, pad_id=0, exact=True)["input_ids"].shape == (2, 18)
    batch = pad_batch(tokens, pad_id=7, length=20, exact=True)
    assert batch["input_ids"].shape == (2, 20)
    np.testing.assert_array_equal(batch["input_ids"][0, 5:], 7)
    with pytest.raises(ValueError, match="18 tokens, more than the 10"):
        pad_batch(tokens, pad_id=0, length=10, exact=True)


def test_epoch_batches_are_deterministic_bucketed_and_complete():
    lengths = np.random.default_rng(0).integers(3, 60, 1000)
    a = epoch_batches(lengths, 32, seed=1, epoch=2)
    b = epoch_batches(lengths, 32, seed=1, epoch=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(a) == 1000 // 32 and all(len(x) == 32 for x in a)
    flat = np.concatenate(a)
    assert len(set(flat)) == flat.size  # no example twice in an epoch
    spread = np.mean([np.ptp(lengths[x]) for x in a])
    assert spread < 10  # bucketed batches are nearly uniform in length (random ones: ~55)
    other = epoch_batches(lengths, 32, seed=1, epoch=3)
    assert not np.array_equal(np.concatenate(other), flat)


def test_eval_batches_cover_every_example_once():
    lengths = np.random.default_rng(1).integers(3, 60, 101)
    batches = eval_batches(lengths, 32)
    assert [len(b) for b in batches] == [32, 32, 32, 5]
    assert sorted(np.concatenate(batches).tolist()) == list(range(101))


def test_batching_refuses_sizes_that_cannot_be_met():
    tokens = [np.array([1, t, 2], np.int32) for t in range(5)]
    full = data.TokenizedSet(tokens, np.arange(5))
    assert [len(b["labels"]) for b in data.labelled_batches(full, 5, 0, 3)] == [3, 2]
    with pytest.raises(ValueError, match="8 calibration examples asked of a set of 5"):
        data.labelled_batches(full, 8, 0, 3)  # was "empty batch: no sequences to pad"
    for size, batch_size in ((0, 3), (4, 0)):
        with pytest.raises(ValueError, match="must be a positive integer"):
            data.labelled_batches(full, size, 0, batch_size)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        eval_batches(np.ones(5), 0)  # was range()'s "arg 3 must not be zero"


# ----------------------------------------------------------------- the protocol on images


def test_subset_draws_without_replacement_and_refuses_a_negative_size():
    tokens = [np.array([1, t, 2], np.int32) for t in range(5)]
    full = data.TokenizedSet(tokens, np.arange(5))
    drawn = data.subset(full, 3, seed=1)
    assert len(drawn) == 3 and len(set(drawn.labels.tolist())) == 3
    assert sorted(data.subset(full, 9).labels.tolist()) == list(range(5))
    with pytest.raises(ValueError, match="subset size must be a non-negative integer, got -1"):
        data.subset(full, -1)  # [:-1] would silently drop one example


def test_text_and_image_sets_implement_the_dataset_protocol():
    from hydra_jax.data import Dataset, ImageSet, TokenizedSet

    images = ImageSet(np.zeros((5, 2, 4, 4), np.float32), np.arange(5))
    tokens = TokenizedSet([np.array([1, 2]), np.array([1, 2, 3])], np.array([0, 1]))
    assert isinstance(images, Dataset) and isinstance(tokens, Dataset)
    batch = images.batch(np.array([3, 1]), batch_size=4)  # filled with copies of the first
    assert batch["pixel_values"].shape == (4, 2, 4, 4) and batch["labels"].tolist() == [3, 1, 3, 3]
    both = images.concat(images.take(np.array([0])))
    assert len(both) == 6 and both.labels.tolist() == [0, 1, 2, 3, 4, 0]
    with pytest.raises(ValueError, match=r"pixels must be \[N, C, H, W\] with one label each"):
        ImageSet(np.zeros((5, 4, 4)), np.arange(5))


def test_an_image_set_feeds_training_prediction_scoring_and_circuit_search(tmp_path):
    """The modality-free layers read images exactly as they read text: a tiny ViT end to end."""
    import jax

    import hydra_jax as hj
    from hydra_jax.data import ImageSet, labelled_batches, uncertainty_batches
    from hydra_jax.evaluation import Method, cost, logits_forward, predict
    from hydra_jax.heads import CircuitSearch, score
    from hydra_jax.models import ViTConfig
    from hydra_jax.training import TrainSettings, fit

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 40)
    pixels = rng.normal(size=(40, 1, 8, 8)).astype(np.float32) + labels[:, None, None, None]
    train = ImageSet(pixels, labels)
    config = ViTConfig(
        testing.encoder(
            layers=2, heads=3, head_dim=4, mlp_dim=10, layer_norm_eps=1e-6, pre_norm=True
        ),
        8,
        4,
        1,
        num_labels=2,
    )
    model = hj.Model.init(config, jax.random.key(0))
    settings = TrainSettings(epochs=3, batch_size=8, learning_rate=3e-3, checkpoint_every=100)
    trained = fit(model, train, settings, tmp_path)
    logits = predict(Method("vit", logits_forward(trained), trained.params), train, 16, False)
    assert logits.shape == (40, 1, 2) and (logits[:, 0].argmax(-1) == labels).mean() > 0.8
    method = Method("vit", logits_forward(trained), trained.params)
    with pytest.raises(ValueError, match="vit: no examples to predict"):
        predict(method, train.take(np.arange(0)), 16, False)  # returned None
    with pytest.raises(ValueError, match="repeats must be a positive integer, got 0"):
        cost(method, train.batch(np.arange(4)), repeats=0)  # a NaN latency
    assert score(trained, labelled_batches(train, 16, 0, 8), method="hies").shape == (2, 3)
    ood = ImageSet(rng.normal(size=(10, 1, 8, 8)).astype(np.float32) * 3, np.zeros(10, int))
    data = uncertainty_batches(train.take(np.arange(12)), ood, batch_size=8)
    assert CircuitSearch(trained)(data, keep_per_layer=1, objective="nll").sum() == 2
