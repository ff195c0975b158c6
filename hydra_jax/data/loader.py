"""Training input with Grain: step s -> this process's rows of the global batch of step s.

The global batches are `epoch_batches` (a pure function of the seed and the epoch), so one
process and N processes train on the same batches in the same order, and the results agree.
Each process loads only the rows its devices hold (`sharding.process_rows`), padded as the
whole batch pads, and `sharding.place_local_batch` assembles the global array. (Grain's own
`ShardByJaxProcess` deals out whole examples, which would change the batches with the
process count.)

The iterator's state is its next index, the step: `TrainState.data_position` in every
checkpoint, so a resumed run continues the same data order (`fit` sets it on restore).
Batches are prepared in Grain's background threads while the device runs the previous step.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from hydra_jax import extras
from hydra_jax.data.dataset import Dataset, epoch_batches
from hydra_jax.models.sharding import process_rows

grain = extras.studies_import("grain", "training input (hydra_jax.training)")


def training_batches(
    train: Dataset, batch_size: int, seed: int, steps_per_epoch: int, total_steps: int
) -> grain.MapDataset:
    """Step s -> `{"examples": [B] global batch indices, "batch": this process's rows}`."""
    lengths = train.lengths
    rows = process_rows(batch_size)

    @functools.lru_cache(maxsize=2)
    def epoch(e: int) -> list[np.ndarray]:
        return epoch_batches(lengths, batch_size, seed, e)

    def load(step: int) -> dict[str, Any]:
        e, index = divmod(int(step), steps_per_epoch)
        examples = epoch(e)[index]
        length = int(lengths[examples].max())  # the whole batch's, in every process
        return {"examples": examples, "batch": train.batch(examples[rows], length=length)}

    return grain.MapDataset.range(total_steps).map(load)


def iterate(batches: grain.MapDataset, start: int) -> grain.DatasetIterator:
    """An iterator over `batches` from step `start`, a few batches prepared ahead in threads."""
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)
    iterator = iter(batches.to_iter_dataset(read_options=options))
    iterator.set_state({"next_index": start})
    return iterator
