"""Streamed images (hydra_jax/data/image_index.py, image_stream.py, pixel_cache.py): every image
source is indexed without decoding and gives, batch by batch, exactly the checkpoint's processor's
pixels of the whole set; the pixel cache is read instead of decoding and is rewritten when its
files change; an image that does not decode is named, or left out where asked."""

from __future__ import annotations

import io
import json
import os
import time
import zipfile

import numpy as np
import pytest
from PIL import Image

import hydra_jax as hj
from hydra_jax.data import files, image_index, pixel_cache
from hydra_jax.data.dataset import DataError, prefetched
from hydra_jax.data.files import ClassNames
from hydra_jax.data.image_stream import ImageStream

LABELS = ["cat", "dog", "cat", "dog", "cat", "dog"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 3-channel checkpoint whose processor resizes (bicubic) to 8 x 8 and normalises."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("checkpoint")
    (path / "config.json").write_text(json.dumps({"model_type": "vit", "num_channels": 3}))
    processor = transformers.ViTImageProcessor(
        size={"height": 8, "width": 8}, resample=3, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor.save_pretrained(path)
    return path


def rgb_images(n: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 10, 12, 3), dtype=np.uint8)


def write_folder(root, images: np.ndarray, labels=LABELS):
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        (root / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / label / f"{i}.png")
    return root


class Counting:
    """Counts the images `image_index.decode` decodes."""

    def __init__(self, monkeypatch):
        self.calls = 0
        decode = image_index.decode

        def counted(file, origin):
            self.calls += 1
            return decode(file, origin)

        monkeypatch.setattr(image_index, "decode", counted)


def whole_set_pixels(checkpoint, images) -> np.ndarray:
    import transformers

    processor = transformers.AutoImageProcessor.from_pretrained(checkpoint)
    return processor(list(images), return_tensors="np",
                     input_data_format="channels_last")["pixel_values"]  # fmt: skip


def test_every_image_source_streams_the_processors_pixels(tmp_path, checkpoint, monkeypatch):
    """A folder, an uncompressed and a compressed npz archive and a saved HF dataset of the same
    images: reading decodes nothing, and the streamed batches equal the processor run on the
    whole set at once (bit for bit)."""
    datasets = pytest.importorskip("datasets")
    images = rgb_images()
    order = np.argsort(LABELS, kind="stable")  # a folder lists class by class
    want = whole_set_pixels(checkpoint, images[order])
    write_folder(tmp_path / "folder", images)
    np.savez(tmp_path / "stored.npz", images=images[order])
    np.savez_compressed(tmp_path / "packed.npz", images=images[order])
    pngs = []
    for image in images[order]:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        pngs.append({"bytes": buffer.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")})
    rows = {"image": pngs, "label": [LABELS[i] for i in order]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "saved")
    counting = Counting(monkeypatch)
    specs = [f"folder:{tmp_path / 'folder'}", f"npz:{tmp_path / 'stored.npz'}",
             f"npz:{tmp_path / 'packed.npz'}", f"hf:{tmp_path / 'saved'}"]  # fmt: skip
    streams = [
        files.to_dataset(files.read(spec, labelled=False, progress=False), checkpoint, None)
        for spec in specs
    ]
    assert counting.calls == 0  # indexed: headers and shapes read, no image decoded
    for spec, stream in zip(specs, streams, strict=True):
        assert isinstance(stream, ImageStream) and len(stream) == 6
        for index in (np.arange(6), np.array([5, 0, 3])):
            np.testing.assert_array_equal(
                stream.batch(index)["pixel_values"], want[index], err_msg=spec
            )
    stored, packed = (files.read(spec, labelled=False).images for spec in specs[1:3])
    assert stored.whole is None and packed.whole is not None  # rows read from the file


def test_a_tfds_image_source_streams_its_records(synthetic_image_dir):
    hj.data.prepare_images(synthetic_image_dir)
    split = files.read("tfds:hydra_image_sets/mnist:test", data_dir=synthetic_image_dir,
                       labelled=False)  # fmt: skip
    images, _ = hj.data.load_images("mnist", "test", synthetic_image_dir)
    read = [split.images[i] for i in range(len(split))]
    assert sorted(r.tobytes() for r in read) == sorted(im.tobytes() for im in images)


def test_a_stream_takes_concatenates_and_fills_batches(tmp_path, checkpoint, monkeypatch):
    images = rgb_images()
    want = whole_set_pixels(checkpoint, images)
    np.savez(tmp_path / "a.npz", images=images[:4], labels=np.arange(4) % 2)
    np.savez(tmp_path / "b.npz", images=images[4:], labels=np.arange(2) % 2)
    classes = ClassNames(("0", "1"))
    a, b = (files.to_dataset(files.read(f"npz:{tmp_path / n}"), checkpoint, classes)
            for n in ("a.npz", "b.npz"))  # fmt: skip
    both = a.concat(b)
    picked = both.take(np.array([5, 1, 4]))
    np.testing.assert_array_equal(picked.batch(np.arange(3))["pixel_values"], want[[5, 1, 4]])
    np.testing.assert_array_equal(picked.labels, [1, 1, 0])
    batch = picked.batch(np.array([2, 0]), batch_size=4)  # filled with its first example
    np.testing.assert_array_equal(batch["pixel_values"], want[[4, 5, 4, 4]])
    np.testing.assert_array_equal(batch["labels"], [0, 1, 0, 0])
    reads = []
    monkeypatch.setattr(image_index.NpzImages, "__getitem__",
                        lambda self, i, get=image_index.NpzImages.__getitem__:
                        reads.append(i) or get(self, i))  # fmt: skip
    both.batch(np.array([1]), batch_size=8)
    assert reads == [1]  # the filling repeats are read once


def truncated_jpeg(path, seed: int = 0) -> None:
    """A JPEG whose header is whole and whose data is cut off: indexing accepts it, decoding
    fails."""
    buffer = io.BytesIO()
    Image.fromarray(rgb_images(1, seed)[0]).save(buffer, format="JPEG")
    data = buffer.getvalue()
    path.write_bytes(data[: data.index(b"\xff\xda") + 16])  # 2 bytes into the scan's data


def test_an_image_that_does_not_decode_is_named_or_left_out(tmp_path, checkpoint):
    root = write_folder(tmp_path / "folder", rgb_images())
    truncated_jpeg(root / "dog" / "9.jpg")
    split = files.read(f"folder:{root}")  # the header is an image's: indexed
    stream = files.to_dataset(split, checkpoint, ClassNames.build(split.labels))
    bad = len(split) - 1  # the last file of the last class
    stream.batch(np.arange(bad))
    with pytest.raises(DataError, match=rf"{root / 'dog' / '9.jpg'}: not a readable image"):
        stream.batch(np.arange(len(split)))
    good, names = image_index.decodable(split.images, progress=False, chunk=2)
    np.testing.assert_array_equal(good, np.arange(bad))
    assert names == [str(root / "dog" / "9.jpg")]


def test_the_pixel_cache_is_read_and_a_changed_set_gets_an_entry_of_its_own(
    tmp_path, checkpoint, monkeypatch
):
    images = rgb_images()
    root = write_folder(tmp_path / "folder", images)
    cache = tmp_path / "cache"

    def stream() -> ImageStream:
        split = files.read(f"folder:{root}", progress=False)
        return files.to_dataset(split, checkpoint, ClassNames.build(split.labels))

    counting = Counting(monkeypatch)
    first = pixel_cache.cached(stream(), cache, "folder:images", progress=False)
    assert counting.calls == 6
    direct = stream().batch(np.arange(6))["pixel_values"]
    counting.calls = 0
    again = pixel_cache.cached(stream(), cache, "folder:images", progress=False)
    assert counting.calls == 0  # read from the cache, nothing decoded
    for cached in (first, again):
        np.testing.assert_array_equal(cached.batch(np.arange(6))["pixel_values"], direct)
        np.testing.assert_array_equal(cached.labels, [0, 0, 0, 1, 1, 1])
    (old,) = cache.glob("*.npy")
    np.testing.assert_array_equal(np.load(old), direct)  # np.load reads it (the trailer after)
    changed = root / "dog" / "1.png"
    Image.fromarray(255 - images[1]).save(changed)
    os.utime(changed, ns=(1, 1))  # another modification time, whatever the clock
    rewritten = pixel_cache.cached(stream(), cache, "folder:images", progress=False)
    assert old.exists() and len(list(cache.glob("*.npy"))) == 2  # a run may still read the old
    np.testing.assert_array_equal(first.batch(np.arange(6))["pixel_values"], direct)
    np.testing.assert_array_equal(rewritten.batch(np.arange(6))["pixel_values"],
                                  stream().batch(np.arange(6))["pixel_values"])  # fmt: skip
    assert not np.array_equal(rewritten.batch(np.array([3]))["pixel_values"], direct[[3]])
    assert list(cache.glob(".*.tmp")) == []


def test_the_cache_key_holds_the_libraries_and_our_decoding(tmp_path, checkpoint, monkeypatch):
    root = write_folder(tmp_path / "folder", rgb_images())
    split = files.read(f"folder:{root}", progress=False)
    stream = files.to_dataset(split, checkpoint, ClassNames.build(split.labels))
    key = pixel_cache.key_of(stream)
    for module, name, value in ((pixel_cache.PIL, "__version__", "0.0"),
                                (pixel_cache.np, "__version__", "0.0"),
                                (pixel_cache, "DECODING", -1)):  # fmt: skip
        with monkeypatch.context() as patch:
            patch.setattr(module, name, value)
            assert pixel_cache.key_of(stream) != key, name


def test_a_damaged_or_foreign_entry_is_not_read(tmp_path, checkpoint):
    """Cut short, its tail zero-filled (a hole), another key's trailer, a plain .npy."""
    root = write_folder(tmp_path / "folder", rgb_images())
    split = files.read(f"folder:{root}", progress=False)
    stream = files.to_dataset(split, checkpoint, ClassNames.build(split.labels))
    cache = tmp_path / "cache"
    pixel_cache.cached(stream, cache, "folder", progress=False)
    key = pixel_cache.key_of(stream)
    path = cache / f"{key}.npy"
    whole = path.read_bytes()
    assert pixel_cache.open_pixel_file(path, key) is not None
    assert pixel_cache.open_pixel_file(path, "0" * 32) is None
    for damaged in (whole[:-4], whole[:-100] + bytes(100), whole[: -pixel_cache.TRAILER]):
        path.write_bytes(damaged)
        assert pixel_cache.open_pixel_file(path, key) is None
    np.save(path, np.zeros((6, 3, 8, 8), np.float32))
    assert pixel_cache.open_pixel_file(path, key) is None
    again = pixel_cache.cached(stream, cache, "folder", progress=False)  # written anew
    assert path.read_bytes() == whole and len(again) == 6


def test_stale_temporary_files_and_unused_entries_are_removed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    day = 86400
    for name, age in ((".a.dead.tmp", 2 * day), (".b.live.tmp", 60), ("old.npy", 31 * day),
                      ("used.npy", 29 * day)):  # fmt: skip
        (cache / name).write_bytes(b"x")
        os.utime(cache / name, (time.time() - age, time.time() - age))
    pixel_cache.clean(cache)
    assert sorted(p.name for p in cache.iterdir()) == [".b.live.tmp", "used.npy"]
    pixel_cache.clean(cache, keep_days=7)
    assert sorted(p.name for p in cache.iterdir()) == [".b.live.tmp"]


def test_npz_rows_are_read_from_a_zip64_archive_too(tmp_path):
    images = rgb_images()
    with (
        zipfile.ZipFile(tmp_path / "z.npz", "w") as archive,
        archive.open("images.npy", "w", force_zip64=True) as member,
    ):
        np.lib.format.write_array(member, images)
    index, _ = image_index.open_npz(tmp_path / "z.npz", labelled=False)
    assert index.whole is None
    np.testing.assert_array_equal(np.stack([index[i] for i in range(6)]), images)


def test_prefetched_keeps_the_order_and_raises_what_a_worker_raised():
    assert [made for _, made in prefetched(lambda x: x * x, range(10), ahead=3)] == [
        x * x for x in range(10)
    ]

    def fails(x: int) -> int:
        if x == 4:
            raise DataError("image 4")
        return x

    with pytest.raises(DataError, match="image 4"):
        list(prefetched(fails, range(10)))


def test_encoded_records_are_decoded_and_a_bad_one_is_named_by_its_source():
    """Records that hold their image encoded (TFDS's `SkipDecoding`): decoded when read; one
    that does not decode names the source and the row."""
    image = rgb_images(1)[0]
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    records = [{"image": buffer.getvalue()}, {"image": b"not a png"}]
    index = image_index.RecordImages(records, "tfds:shapes:test", "")
    np.testing.assert_array_equal(index[0], image)
    with pytest.raises(DataError, match=r"tfds:shapes:test row 1: not a readable image"):
        index[1]
