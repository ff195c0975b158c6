"""Data a researcher has (hydra_jax/data/files.py): every source kind read into the same
examples, labels mapped one way for every split, preprocessing from the checkpoint's files, and
each bad-data case refused with the file and the problem named."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import hydra_jax as hj
from hydra_jax.data import files
from hydra_jax.data.files import ClassNames, Columns, DataError, Source

TEXTS = ["a gripping film", "dull, and far too long", "fine", "a joy from start to end"]
LABELS = ["positive", "negative", "negative", "positive"]


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory) -> Path:
    """The MiniLM tokenizer, with a classifier's `id2label` in its config."""
    path = tmp_path_factory.mktemp("text_checkpoint")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "config.json"):
        shutil.copy(hj.minilm_l6_path() / name, path / name)
    config = json.loads((path / "config.json").read_text())
    config["id2label"] = {"0": "negative", "1": "positive"}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def image_checkpoint(tmp_path_factory) -> Path:
    """A 3-channel checkpoint whose processor resizes to 8 x 8 and normalises with mean 0.5."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("image_checkpoint")
    (path / "config.json").write_text(json.dumps({"model_type": "vit", "num_channels": 3}))
    transformers.ViTImageProcessor(size={"height": 8, "width": 8}, image_mean=[0.5] * 3,
                                   image_std=[0.5] * 3).save_pretrained(path)  # fmt: skip
    return path


def write_tables(root: Path) -> dict[str, Path]:
    """The same four labelled sentences as CSV, TSV, JSON Lines and Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    paths = {kind: root / f"train.{kind}" for kind in ("csv", "tsv", "jsonl", "parquet")}
    for kind, delimiter in (("csv", ","), ("tsv", "\t")):
        with paths[kind].open("w", newline="") as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(["id", "text", "label"])
            writer.writerows([i, t, y] for i, (t, y) in enumerate(zip(TEXTS, LABELS, strict=True)))
    rows = [{"text": t, "label": y} for t, y in zip(TEXTS, LABELS, strict=True)]
    paths["jsonl"].write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.table({"text": TEXTS, "label": LABELS}), paths["parquet"])
    return paths


def test_sources_parse_and_unknown_kinds_are_named():
    assert Source.parse("csv:data/train.csv") == Source("csv", "data/train.csv")
    assert Source.parse("tfds:mnist:test[:50%]") == Source("tfds", "mnist", "test[:50%]")
    assert Source.parse("hf:saved:validation") == Source("hf", "saved", "validation")
    assert Source.parse("hf:/data/saved") == Source("hf", "/data/saved")
    with pytest.raises(DataError, match=r"'xlsx:a\.xlsx' is not KIND:LOCATION with KIND one of"):
        Source.parse("xlsx:a.xlsx")
    with pytest.raises(DataError, match=r"a TFDS source is tfds:NAME:SPLIT"):
        Source.parse("tfds:mnist")


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl", "parquet"])
def test_every_table_kind_reads_the_same_examples(tmp_path, text_checkpoint, kind):
    path = write_tables(tmp_path)[kind]
    split = files.read(f"{kind}:{path}")
    assert split.texts == TEXTS and split.labels == LABELS
    classes = ClassNames.build(split.labels, files.checkpoint_id2label(text_checkpoint))
    assert classes.names == ("negative", "positive")  # the checkpoint's order, not sorted order
    data = files.to_dataset(split, text_checkpoint, classes)
    np.testing.assert_array_equal(data.labels, [1, 0, 0, 1])
    encoder = hj.data.TextEncoder(text_checkpoint)
    for got, want in zip(data.tokens, encoder(TEXTS), strict=True):
        np.testing.assert_array_equal(got, want)


def test_labels_follow_one_mapping_for_every_split():
    """Without names in the checkpoint: sorted strings, or integers (also as CSV text) as is."""
    classes = ClassNames.build(["pos", "neg", "neutral", "pos"])
    assert classes.names == ("neg", "neutral", "pos")
    np.testing.assert_array_equal(classes.encode(["neutral", "pos"], "test.csv"), [1, 2])
    numbered = ClassNames.build(["0", "2", "1"])
    assert numbered.names == ("0", "1", "2")
    np.testing.assert_array_equal(numbered.encode([2, "0", np.int64(1)], "x"), [2, 0, 1])


def test_sentence_pairs_carry_token_types(tmp_path, text_checkpoint):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"premise": "a dog runs", "hypothesis": "an animal moves", "label": 0},
        {"premise": "it rains", "hypothesis": "the sun shines brightly", "label": 1},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = files.read(f"jsonl:{path}", Columns(text="premise", pair="hypothesis"))
    data = files.to_dataset(split, text_checkpoint, ClassNames.build(split.labels))
    batch = data.batch(np.arange(2), batch_size=3)
    first, second = batch["token_type_ids"][0], batch["input_ids"][0]
    n_first = len(hj.data.TextEncoder(text_checkpoint)(["a dog runs"])[0])  # [CLS] a dog runs [SEP]
    assert np.all(first[:n_first] == 0) and np.all(first[n_first : data.tokens[0].size] == 1)
    assert np.all(first[data.tokens[0].size :] == 0)  # padding
    assert second[0] == 101 and second[n_first - 1] == 102  # [CLS] ... [SEP]
    np.testing.assert_array_equal(batch["token_type_ids"][2], batch["token_type_ids"][0])
    both = data.concat(data.take(np.array([1])))
    np.testing.assert_array_equal(both.type_ids[2], data.type_ids[1])
    with pytest.MonkeyPatch.context() as patch:  # tokenised in chunks: the same ids and types
        patch.setattr(files, "TOKENIZE_CHUNK", 1)
        chunked = files.to_dataset(split, text_checkpoint, ClassNames.build(split.labels))
    for got, want in ((chunked.tokens, data.tokens), (chunked.type_ids, data.type_ids)):
        assert [t.tolist() for t in got] == [t.tolist() for t in want]


def test_image_folder_and_npz_read_the_same_pixels(tmp_path, image_checkpoint):
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (4, 10, 12), dtype=np.uint8)
    labels = ["cat", "dog", "cat", "dog"]
    for i, (image, label) in enumerate(zip(grey, labels, strict=True)):
        (tmp_path / "folder" / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "folder" / label / f"{i}.png")
    np.savez(tmp_path / "ood.npz", images=grey)
    folder = files.read(f"folder:{tmp_path / 'folder'}")
    assert folder.labels == ["cat", "cat", "dog", "dog"]  # class folders, files sorted
    classes = ClassNames.build(folder.labels)
    data = files.to_dataset(folder, image_checkpoint, classes)
    pixels = data.batch(np.arange(4))["pixel_values"]
    assert pixels.shape == (4, 3, 8, 8)
    np.testing.assert_array_equal(data.labels, [0, 0, 1, 1])
    processor = transformers.AutoImageProcessor.from_pretrained(image_checkpoint)
    rgb = [np.repeat(im[..., None], 3, -1) for im in grey[[0, 2, 1, 3]]]
    want = processor(rgb, return_tensors="np", input_data_format="channels_last")["pixel_values"]
    np.testing.assert_array_equal(pixels, want)  # grey repeated to the model's 3 channels
    ood = files.to_dataset(files.read(f"npz:{tmp_path / 'ood.npz'}", labelled=False),
                           image_checkpoint, None)  # fmt: skip
    assert np.all(ood.labels == files.NO_LABEL)
    np.testing.assert_array_equal(ood.batch(np.array([0, 2, 1, 3]))["pixel_values"], pixels)


def test_a_prepared_tfds_dataset_is_read_without_download(synthetic_data_dir):
    hj.data.load("movie_reviews", "test", synthetic_data_dir)  # prepares the embedded builders
    split = files.read("tfds:vader_sentences/movie_reviews:test", data_dir=synthetic_data_dir)
    reference = hj.data.load("movie_reviews", "test", synthetic_data_dir)
    assert sorted(split.texts) == sorted(reference.texts)
    assert sorted(split.labels) == sorted(reference.labels.tolist())
    with pytest.raises(DataError, match=r"tfds:no_such_set:test in .*not a prepared TFDS"):
        files.read("tfds:no_such_set:test", data_dir=synthetic_data_dir)


def test_a_saved_hf_dataset_is_read(tmp_path):
    datasets = pytest.importorskip("datasets")
    saved = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": TEXTS, "label": [1, 0, 0, 1]}),
        "test": datasets.Dataset.from_dict({"text": TEXTS[:2], "label": [1, 0]}),
    })  # fmt: skip
    saved.save_to_disk(tmp_path / "saved")
    split = files.read(f"hf:{tmp_path / 'saved'}:test")
    assert split.texts == TEXTS[:2] and split.labels == [1, 0]
    with pytest.raises(DataError, match=r"no split 'validation' \(it has train, test\)"):
        files.read(f"hf:{tmp_path / 'saved'}:validation")


# ----------------------------------------------------------------------------- bad data


def test_bad_tables_are_refused_naming_the_file(tmp_path, text_checkpoint):
    paths = write_tables(tmp_path)
    with pytest.raises(DataError, match=rf"{paths['csv']}: no column 'sentence' \(its columns: "
                                        r"id, text, label\)"):  # fmt: skip
        files.read(f"csv:{paths['csv']}", Columns(text="sentence"))
    with pytest.raises(DataError, match=rf"{paths['parquet']}: no column 'y'"):
        files.read(f"parquet:{paths['parquet']}", Columns(label="y"))
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    with pytest.raises(DataError, match=rf"{empty}: no examples \(an empty split\)"):
        files.read(f"csv:{empty}")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine", "label": 1}\n{"text": oops}\n')
    with pytest.raises(DataError, match=rf"{broken}: line 2 is not JSON"):
        files.read(f"jsonl:{broken}")
    blank = tmp_path / "blank.csv"
    blank.write_text("text,label\nfine,1\n,0\n")
    with pytest.raises(DataError, match=rf"{blank}: row 2 has no 'text'"):
        files.read(f"csv:{blank}")
    with pytest.raises(DataError, match=r"missing\.csv does not exist"):
        files.read(f"csv:{tmp_path / 'missing.csv'}")


def test_bad_labels_are_refused_naming_the_file_and_row(tmp_path, text_checkpoint):
    classes = ClassNames.build([], files.checkpoint_id2label(text_checkpoint))
    with pytest.raises(DataError, match=r"test\.csv: row 2 has label 'neutral', not one of the 2 "
                                        r"classes \['negative', 'positive'\]"):  # fmt: skip
        classes.encode(["positive", "neutral"], "test.csv")
    with pytest.raises(DataError, match=r"test\.csv: row 1 has label 2, outside the classifier's "
                                        r"2 classes 0\.\.1"):  # fmt: skip
        classes.encode([2], "test.csv")
    with pytest.raises(DataError, match=r"row 1 has label -1, outside"):
        classes.encode(["-1"], "test.csv")


def test_bad_images_are_refused_naming_the_file(tmp_path, image_checkpoint):
    root = tmp_path / "images"
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(root / "cat" / "0.png")
    with pytest.raises(DataError, match=rf"{root / 'dog'}: a class folder with no images"):
        files.read(f"folder:{root}")
    (root / "dog" / "1.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=rf"{root / 'dog' / '1.png'}: not a readable image"):
        files.read(f"folder:{root}")
    np.savez(tmp_path / "floats.npz", images=np.zeros((2, 4, 4), np.float32))
    with pytest.raises(DataError, match=r"floats\.npz: 'images' must be uint8 \[N, H, W\]"):
        files.read(f"npz:{tmp_path / 'floats.npz'}")
    np.savez(tmp_path / "unlabelled.npz", images=np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(DataError, match=r"unlabelled\.npz: no 'labels' array"):
        files.read(f"npz:{tmp_path / 'unlabelled.npz'}")
    # Mixed sizes are refused where the checkpoint's processor does not resize.
    fixed = tmp_path / "fixed"
    shutil.copytree(image_checkpoint, fixed)
    processor = json.loads((fixed / "preprocessor_config.json").read_text())
    (fixed / "preprocessor_config.json").write_text(json.dumps({**processor, "do_resize": False}))
    mixed = files.RawSplit("mixed.npz", images=[np.zeros((4, 4), np.uint8),
                                                np.zeros((5, 4), np.uint8)])  # fmt: skip
    with pytest.raises(DataError, match=r"mixed\.npz: images of several sizes .* does not resize"):
        files.to_dataset(mixed, fixed, None)
    rgba = files.RawSplit("four.npz", images=[np.zeros((4, 4, 4), np.uint8)])
    with pytest.raises(DataError, match=r"four\.npz: image 0 has 4 channels; the model takes 3"):
        files.to_dataset(rgba, image_checkpoint, None)
