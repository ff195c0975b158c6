"""Evaluators: batched jit-compiled predictions, metrics per method, costs, artefacts on disk.

Artefacts (SPEC section 8): `results.json` (fractions), `report.md` (percentages),
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

from hydra_jax import metrics
from hydra_jax.baselines import Forward
from hydra_jax.data.text import eval_batches
from hydra_jax.training import TokenizedSet

OOD_SCORES = ("msp", "entropy", "energy", "mi")


@dataclasses.dataclass(frozen=True)
class Method:
    """A named forward function with its weights; `forward(weights, batch) -> [B, M, C]`."""

    name: str
    forward: Forward
    weights: Any

    @property
    def num_params(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.weights))


def predict(method: Method, data: TokenizedSet, batch_size: int) -> np.ndarray:
    """Member logits `[N, M, C]` in the order of `data`, from length-sorted batches."""
    forward = jax.jit(method.forward)
    out = None
    for index in tqdm(eval_batches(data.lengths, batch_size), desc=method.name, leave=False):
        logits = np.asarray(forward(method.weights, data.batch(index, batch_size)))
        if out is None:
            out = np.zeros((len(data.tokens), *logits.shape[1:]), np.float32)
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
    ood["mean"] = {
        k: float(np.mean([ood[n][k] for n in ood_sets])) for k in ("auroc", "aupr", "fpr95")
    }
    return {
        "id": metrics.classification(id_probs, predictions["labels"], num_bins),
        "ood": ood,
    }


def xla_flops(compiled: Any) -> float:
    """FLOPs XLA reports for a compiled program (`jax.jit(f).lower(...).compile()`)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax returned one dict per device
        analysis = analysis[0]
    return float(analysis["flops"])


def random_tokens(rng: np.random.Generator, batch_size: int, tokens: int) -> dict[str, np.ndarray]:
    """A full-length batch of random word-piece ids `[B, T]` (no padding): latency measurements."""
    ids = rng.integers(1000, 30000, (batch_size, tokens)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}


def cost(method: Method, batch: dict[str, np.ndarray], repeats: int = 10) -> dict[str, float]:
    """Parameters, XLA FLOPs per example, median latency and throughput on one fixed batch."""
    compiled = jax.jit(method.forward).lower(method.weights, batch).compile()
    B = batch["input_ids"].shape[0]
    jax.block_until_ready(compiled(method.weights, batch))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(method.weights, batch))
        times.append(time.perf_counter() - start)
    latency = float(np.median(times))
    return {
        "params": method.num_params,
        "flops_per_example": xla_flops(compiled) / B,
        "latency_ms": latency * 1e3,
        "examples_per_s": B / latency,
    }


def save_predictions(path: Path, predictions: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **predictions)


def write_results(workdir: Path, results: dict[str, Any]) -> None:
    (workdir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
