"""One run's use of a shared pixel cache, as a separate process (tests/test_shared_storage.py):
`python tests/pixel_cache_run.py FOLDER CHECKPOINT CACHE DELAY` builds or reads the cache of
FOLDER's images with CHECKPOINT's processor, each image's decoding delayed by DELAY seconds,
then checks every cached row against the processor's pixels and prints `ok KEY`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from hydra_jax.data import files, image_index, pixel_cache
from hydra_jax.data.files import ClassNames


def main(folder: str, checkpoint: str, cache: str, delay: str) -> None:
    decode = image_index.decode

    def slow(file, origin):
        time.sleep(float(delay))
        return decode(file, origin)

    image_index.decode = slow  # a long build, so that others run beside it (or it is killed)

    def stream():
        split = files.read(f"folder:{folder}", progress=False)
        return files.to_dataset(split, Path(checkpoint), ClassNames.build(split.labels))

    cached = pixel_cache.cached(stream(), Path(cache), f"folder:{folder}", progress=False,
                                batch_size=1)  # fmt: skip
    image_index.decode = decode
    rows = np.arange(len(cached))
    want = stream().batch(rows)["pixel_values"]
    np.testing.assert_array_equal(cached.batch(rows)["pixel_values"], want)
    print("ok", pixel_cache.key_of(stream()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
