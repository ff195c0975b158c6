"""Prediction (the one loop every caller uses), metrics per method, costs, artefacts on disk.

Artefacts: `results.json` (fractions), `report.md` (percentages),
`predictions/NAME.npz` (member probabilities and logits for the ID test set and every OOD set,
plus labels, so every number can be recomputed) and `plots/`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from hydra_jax import checks, metrics
from hydra_jax.data import Dataset, eval_batches
from hydra_jax.ensembles.baselines import Forward
from hydra_jax.models.architectures import weight_count
from hydra_jax.models.sharding import overlapped, place_batch, place_params

OOD_SCORES = ("msp", "entropy", "energy", "mi")


@dataclasses.dataclass(frozen=True)
class Method:
    """A named forward function with its weights; `forward(weights, batch) -> [B, M, C]`.

    `stacked`: every weight has a leading member axis (a Deep Ensemble's `stack`), which a mesh
    splits over `member` (`hydra_jax.models.sharding`). `loop_trips`: how many times the
    forward runs a loop body that XLA's cost analysis counts once (MC dropout's `lax.map` over
    its samples); its FLOPs are multiplied by it.
    """

    name: str
    forward: Forward
    weights: Any
    stacked: bool = False
    loop_trips: int = 1

    @property
    def num_params(self) -> int:
        return weight_count(self.weights)


def predict(method: Method, data: Dataset, batch_size: int, progress: bool = True) -> np.ndarray:
    """Member logits `[N, M, C]` in the order of `data`, from size-sorted batches.

    Every batch has `batch_size` rows (the last is filled), so one compiled program serves a
    whole dataset; `jax.jit` caches it on `method.forward`, so calls with other weights (other
    head masks, other members) of the same shapes compile nothing new.
    """
    if len(data) == 0:
        raise ValueError(f"{method.name}: no examples to predict")
    forward = jax.jit(method.forward)
    weights = place_params(method.weights, method.stacked)  # on the current mesh, if any
    out = None
    batches = tqdm(
        eval_batches(data.lengths, batch_size), desc=method.name, leave=False, disable=not progress
    )

    def dispatch(index: np.ndarray) -> jax.Array:
        return forward(weights, place_batch(data.batch(index, batch_size)))

    for index, logits in overlapped(batches, dispatch):  # the next batch runs while one is read
        if out is None:
            out = np.zeros((len(data), *logits.shape[1:]), np.float32)
        out[index] = logits[: len(index)]
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def method_metrics(
    predictions: dict[str, np.ndarray], ood_sets: list[str], num_bins: int = 15
) -> dict[str, Any]:
    """ID and per-OOD-set metrics from a predictions dict (the contents of `NAME.npz`)."""
    return {
        "id": metrics.classification(predictions["id_probs"], predictions["labels"], num_bins),
        "ood": ood_metrics(predictions, ood_sets),
    }


def ood_metrics(predictions: dict[str, np.ndarray], ood_sets: list[str]) -> dict[str, Any]:
    """Per OOD set, detection of it against the ID test set by each score (MSP at the top
    level, every score under `by_score`), and the mean over the sets (none: no mean)."""
    id_probs, id_logits = predictions["id_probs"], predictions["id_logits"]
    members = id_probs.shape[1]
    scores = [s for s in OOD_SCORES if s != "mi" or members > 1]
    id_scores = {s: metrics.ood_score(id_probs, s, id_logits) for s in scores}
    ood: dict[str, Any] = {}
    for name in ood_sets:
        probs, logits = predictions[f"ood_{name}_probs"], predictions[f"ood_{name}_logits"]
        by_score = {
            s: metrics.ood(id_scores[s], metrics.ood_score(probs, s, logits)) for s in scores
        }
        ood[name] = {**by_score["msp"], "by_score": by_score}
    if ood_sets:  # a study may have none (calibration only)
        ood["mean"] = {
            k: float(np.mean([ood[n][k] for n in ood_sets])) for k in ("auroc", "aupr", "fpr95")
        }
    return ood


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


def logits_forward(model: Any) -> Forward:
    """`(params, batch) -> [B, M, C]` of a classifier (M = 1) or a fused Hydra (M members)."""

    def forward(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits = model.apply(params, **batch).logits
        return logits if logits.ndim == 3 else logits[:, None, :]

    return forward
