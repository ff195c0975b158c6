"""Temperature scaling (Guo et al. 2017) of a single model or an ensemble, fitted by NLL.

An ensemble is scaled with one temperature shared by its members: member logits `z_m / T`,
then the softmax and the member mean, `p_T = mean_m softmax(z_m / T)`, and `T` minimises the
NLL of `p_T` on held-out labels. Calibrating the pooled prediction (one parameter, as for a
single model) rather than each member keeps the members' disagreement, and is the order
Rahaman & Thiery (2021) found right for ensembles ("pool, then calibrate"); with M = 1 it is
exactly Guo et al.'s method.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from hydra_jax.metrics.core import _member_probs, check_labels

# The search range of T: wide enough for any classifier trained with cross-entropy.
BOUNDS = (0.05, 20.0)


def scaled(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Member probabilities `[B, M, C]` of member logits `[B, M, C]` (or `[B, C]`) divided by
    `temperature`, float64."""
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"the temperature must be a positive number, got {temperature!r}")
    z = _member_probs(logits) / temperature
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """NLL of the member mean of `scaled(logits, temperature)` at `labels` `[B]`."""
    p = scaled(logits, temperature).mean(1)  # [B, C]
    B, C = p.shape
    labels = check_labels(labels, B, C)
    return float(-np.log(np.maximum(p[np.arange(B), labels], np.finfo(np.float64).tiny)).mean())


def fit(logits: np.ndarray, labels: np.ndarray, bounds: tuple[float, float] = BOUNDS) -> float:
    """The temperature in `bounds` that minimises `nll` on `(logits, labels)`: the best of a
    grid of 161 log-spaced temperatures, refined by a bounded scalar search between its
    neighbours (the NLL of an ensemble need not be convex in T).

    Raises:
      ValueError: empty or non-finite logits, labels of the wrong shape, type or range, or
        `bounds` that are not `0 < low < high`.
    """
    low, high = bounds
    if not 0 < low < high:
        raise ValueError(f"temperature bounds must be 0 < low < high, got {bounds}")
    logits = _member_probs(logits)
    check_labels(labels, logits.shape[0], logits.shape[-1])
    grid = np.geomspace(low, high, 161)
    losses = [nll(logits, labels, t) for t in grid]
    best = int(np.argmin(losses))
    lo, hi = np.log(grid[max(best - 1, 0)]), np.log(grid[min(best + 1, grid.size - 1)])
    found = optimize.minimize_scalar(
        lambda log_t: nll(logits, labels, float(np.exp(log_t))),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-7},
    )
    t = float(np.exp(found.x))
    return t if nll(logits, labels, t) <= losses[best] else float(grid[best])
