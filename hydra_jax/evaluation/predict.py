"""Prediction (the one loop every caller uses), metrics per method, costs, artefacts on disk.

Artefacts: `results.json` (fractions), `report.md` (percentages),
`predictions/NAME.npz` (member logits and probabilities of every evaluated set, member features
where a feature-space detector reads them, and labels, so every number can be recomputed) and
`plots/`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from hydra_jax import checks
from hydra_jax.data import Dataset, eval_batches
from hydra_jax.data.dataset import Batch, prefetched
from hydra_jax.ensembles.baselines import Forward, NoFeaturesError, Read, logits, with_features
from hydra_jax.models.architectures import weight_count
from hydra_jax.models.sharding import (
    overlapped,
    place_local_batch,
    place_params,
    process_rows,
    rows_sharding,
)


@dataclasses.dataclass(frozen=True)
class Method:
    """A named forward function with its weights; `forward(weights, batch) -> [B, M, C]`.

    `stacked`: every weight has a leading member axis (a Deep Ensemble's `stack`), which a mesh
    splits over `member` (`hydra_jax.models.sharding`). `loop_trips`: how many times the
    forward runs a loop body that XLA's cost analysis counts once (MC dropout's `lax.map` over
    its samples); its FLOPs are multiplied by it. `features`: the same forward returning the
    member logits and member features `[B, M, F]` (`ModelOutput.features`) from one pass, or
    None where the method has none.
    """

    name: str
    forward: Forward
    weights: Any
    stacked: bool = False
    loop_trips: int = 1
    features: Forward | None = None

    @property
    def num_params(self) -> int:
        return weight_count(self.weights)


def predict(
    method: Method, data: Dataset, batch_size: int, progress: bool = True, features: bool = False
) -> Any:
    """Member logits `[N, M, C]` in the order of `data`, from size-sorted batches; with
    `features`, the pair of member logits and member features `[N, M, F]` (one pass).

    Every batch has `batch_size` rows (the last is filled), so one compiled program serves a
    whole dataset; `jax.jit` caches it on `method.forward`, so calls with other weights (other
    head masks, other members) of the same shapes compile nothing new.
    """
    if len(data) == 0:
        raise ValueError(f"{method.name}: no examples to predict")
    if features and method.features is None:
        raise NoFeaturesError(f"{method.name} has no features forward")
    # Outputs split by rows as the inputs are (on a mesh; `jax.jit` still caches the program on
    # `method.forward`, the layout being part of its key).
    forward = jax.jit(
        method.features if features else method.forward, out_shardings=rows_sharding(batch_size)
    )
    weights = place_params(method.weights, method.stacked)  # on the current mesh, if any
    out: list[np.ndarray] | None = None
    batches = tqdm(
        eval_batches(data.lengths, batch_size), desc=method.name, leave=False, disable=not progress
    )

    rows, lengths = process_rows(batch_size), data.lengths

    def make(index: np.ndarray) -> Batch:
        """This process's rows of the filled batch of `index`, padded as the whole batch pads
        (several processes each read only their rows)."""
        filled = np.r_[index, np.repeat(index[:1], batch_size - len(index))]
        return data.batch(filled[rows], length=int(lengths[filled].max()))

    def dispatched() -> Iterator[tuple[np.ndarray, Any]]:
        """Batches made in threads (images decoded) while the device runs the one before;
        each host batch is let go once it is dispatched."""
        for index, batch in prefetched(make, batches):
            result = forward(weights, place_local_batch(batch, batch_size))
            del batch
            yield index, result

    # Each result is read only after the next batch is dispatched.
    for (index, _), arrays in overlapped(dispatched(), lambda item: item[1]):
        arrays = arrays if features else (arrays,)
        if out is None:
            out = [np.zeros((len(data), *a.shape[1:]), np.float32) for a in arrays]
        for buffer, a in zip(out, arrays, strict=True):
            buffer[index] = a[: len(index)]
    assert out is not None
    return tuple(out) if features else out[0]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def xla_flops(compiled: Any) -> float:
    """FLOPs XLA reports for a compiled program (`jax.jit(f).lower(...).compile()`)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax returned one dict per device
        analysis = analysis[0]
    return float(analysis["flops"])


def cost(method: Method, batch: dict[str, np.ndarray], repeats: int = 10) -> dict[str, float]:
    """Parameters, XLA FLOPs per example, median latency and throughput on one fixed batch."""
    checks.count("repeats", repeats)
    compiled = jax.jit(method.forward).lower(method.weights, batch).compile()
    B = next(iter(batch.values())).shape[0]
    jax.block_until_ready(compiled(method.weights, batch))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(method.weights, batch))
        times.append(time.perf_counter() - start)
    latency = float(np.median(times))
    return {
        "params": method.num_params,
        "flops_per_example": method.loop_trips * xla_flops(compiled) / B,
        "latency_ms": latency * 1e3,
        "examples_per_s": B / latency,
    }


def save_predictions(path: Path, predictions: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **predictions)


def write_results(workdir: Path, results: dict[str, Any]) -> None:
    (workdir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))


def logits_forward(model: Any, read: Read = logits) -> Forward:
    """`(params, batch) -> [B, M, C]` of a classifier (M = 1) or a fused Hydra or single-pass
    ensemble (M members); with `read=with_features`, member logits and member features."""

    def forward(params: Any, batch: dict[str, jax.Array]) -> Any:
        out = read(model.apply(params, **batch))
        ndim = jax.tree.leaves(out)[0].ndim  # the logits': [B, C] or [B, M, C]
        return out if ndim == 3 else jax.tree.map(lambda y: y[:, None], out)

    return forward


def model_method(name: str, model: Any) -> Method:
    """A classifier, fused Hydra or single-pass ensemble as a method, with its features."""
    features = logits_forward(model, with_features)
    return Method(name, logits_forward(model), model.params, features=features)
