"""The dataset protocol that text and images both implement, and batching over it.

Training, prediction, head scoring and circuit search read datasets only through `Dataset`:
a length, labels, a per-example size for bucketing, and padded model-input batches. Batch
orders are pure functions of (sizes, batch size, seed, epoch), so a resumed run sees the same
batches as an uninterrupted one.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, Self, TypeVar, runtime_checkable

import numpy as np

from hydra_jax import checks
from hydra_jax.heads import UncertaintyBatches

Batch = dict[str, np.ndarray]
Item = TypeVar("Item")
Made = TypeVar("Made")
NO_LABEL = -1  # the label of an OOD example: it belongs to no class


class DataError(ValueError):
    """Data that cannot be used as given; the message names the file and the problem."""


@runtime_checkable
class Dataset(Protocol):
    """N labelled examples that batch into model inputs named as `transformers` names them."""

    labels: np.ndarray  # [N] integer classes (`NO_LABEL` = -1 for OOD sets)

    def __len__(self) -> int: ...

    @property
    def lengths(self) -> np.ndarray:
        """`[N]` per-example size (tokens; constant for images): batches group similar sizes."""
        ...

    def batch(self, index: np.ndarray, batch_size: int | None = None, length: int = 0) -> Batch:
        """Model inputs and `labels` for examples `index`.

        With `batch_size`, filled to that many rows by repeating the first example (callers keep
        the first `len(index)` rows), so a short last batch reuses the compiled program. With
        `length`, sequences pad to at least that size (the size of a whole batch whose rows
        several processes load apart; sizes that do not vary ignore it).
        """
        ...

    def take(self, index: np.ndarray) -> Self:
        """The examples `index`, in that order."""
        ...

    def concat(self, other: Self) -> Self:
        """This dataset followed by `other` (same modality and preprocessing)."""
        ...


def subset(data: Dataset, n: int, seed: int = 0) -> Dataset:
    """`n` examples drawn without replacement with `seed` (all of them, shuffled, if n >= N)."""
    checks.count("subset size", n, minimum=0)
    return data.take(np.random.default_rng(seed).permutation(len(data))[:n])


def epoch_batches(
    lengths: np.ndarray, batch_size: int, seed: int, epoch: int, bucket_batches: int = 50
) -> list[np.ndarray]:
    """Shuffled, size-bucketed training batches for one epoch; a pure function of its inputs.

    The epoch's permutation is cut into buckets of `bucket_batches` batches; each bucket is
    sorted by size (so batches pad little) and cut into batches, whose order is shuffled again.
    The incomplete last batch is dropped. Resuming at step s needs only (seed, s).
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches = []
    chunk = batch_size * bucket_batches
    for start in range(0, len(order), chunk):
        bucket = order[start : start + chunk]
        bucket = bucket[np.argsort(lengths[bucket], kind="stable")]
        batches += [bucket[i : i + batch_size] for i in range(0, len(bucket), batch_size)]
    batches = [b for b in batches if len(b) == batch_size]
    return [batches[i] for i in rng.permutation(len(batches))]


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """All examples, sorted by size and cut into batches (the last may be short)."""
    checks.count("batch_size", batch_size)
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def labelled_batches(data: Dataset, size: int, seed: int, batch_size: int) -> list[Batch]:
    """`size` examples drawn with `seed`, as labelled batches (head-scoring calibration)."""
    checks.count("size", size)
    checks.count("batch_size", batch_size)
    if size > len(data):
        raise ValueError(f"{size} calibration examples asked of a set of {len(data)}")
    index = np.random.default_rng(seed).permutation(len(data))[:size]
    return [data.batch(index[i : i + batch_size]) for i in range(0, size, batch_size)]


def uncertainty_batches(id_set: Dataset, ood_set: Dataset, batch_size: int) -> UncertaintyBatches:
    """ID validation + OOD validation examples batched once, for circuit search.

    Batches are size-sorted (little padding); `is_ood` and `labels` follow batch order.
    """
    merged = id_set.concat(ood_set)
    is_ood = np.r_[np.zeros(len(id_set), bool), np.ones(len(ood_set), bool)]
    labels = np.concatenate([id_set.labels, np.zeros(len(ood_set), np.int64)])
    order = np.argsort(merged.lengths, kind="stable")
    batches = [merged.batch(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    return UncertaintyBatches(batches, is_ood[order], labels[order])


def concat_all(sets: Sequence[Dataset]) -> Dataset:
    """The datasets one after another."""
    out = sets[0]
    for other in sets[1:]:
        out = out.concat(other)
    return out


def prefetched(
    make: Callable[[Item], Made], items: Iterable[Item], ahead: int = 2
) -> Iterator[tuple[Item, Made]]:
    """`(item, make(item))` for every item, in order, the next `ahead` made in background
    threads while the caller uses one (PIL's decoding and NumPy release the GIL for much of
    their work; Python code in `make` does not)."""
    with ThreadPoolExecutor(ahead) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append((item, pool.submit(make, item)))
            if len(pending) > ahead:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
