"""Split-conformal prediction sets (LAC, APS, RAPS) from predicted probabilities.

A method scores every (example, class) pair (`nonconformity`, higher = less plausible); the
threshold is the `ceil((n + 1)(1 - alpha)) / n` empirical quantile of the calibration
examples' scores at their labels (`threshold`), and an example's set holds every class whose
score is at most the threshold. For exchangeable calibration and test examples the set holds
the true label with probability at least `1 - alpha` (Vovk et al. 2005; Angelopoulos & Bates
2023, section 1), and, for scores without ties, at most `1 - alpha + 1 / (n + 1)`.

- `lac` (least ambiguous set-valued classifier, Sadinle et al. 2019): `1 - p_y`.
- `aps` (adaptive prediction sets, Romano et al. 2020), non-randomised: the probability mass of
  the classes ranked at or above y, `sum_{c: rank(c) <= rank(y)} p_c`.
- `raps` (regularised APS, Angelopoulos et al. 2021), non-randomised: APS plus
  `penalty * max(0, rank(y) - k_reg)`, which keeps sets small when many classes share little
  mass.

Ranks sort classes by decreasing probability (ties by class index); rank 1 is the top class.
The mass up to the last-ranked class is exactly 1, whatever the rounding of the probabilities.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from hydra_jax import checks
from hydra_jax.metrics.core import _check_distributions, _member_probs, check_labels

Method = Literal["lac", "aps", "raps"]
METHODS: tuple[str, ...] = ("lac", "aps", "raps")


def nonconformity(
    probs: np.ndarray, method: Method = "aps", penalty: float = 0.01, k_reg: int = 5
) -> np.ndarray:
    """Scores `[B, C]` of every class of the member-mean probabilities of `probs` (`[B, C]` or
    `[B, M, C]`), by `method`; `penalty` and `k_reg` are RAPS's.

    Raises:
      ValueError: probabilities that are not (as `classification`), an unknown method, a
        negative penalty or `k_reg`.
    """
    members = _member_probs(probs)
    _check_distributions(members)
    p = members.mean(1)  # [B, C]
    if method == "lac":
        return 1.0 - p
    if method not in METHODS:
        raise ValueError(f"unknown conformal method {method!r}; choose one of {METHODS}")
    if penalty < 0 or k_reg < 0:
        raise ValueError(f"RAPS needs penalty >= 0 and k_reg >= 0, got {penalty}, {k_reg}")
    order = np.argsort(-p, axis=-1, kind="stable")  # [B, C] classes by rank
    mass = np.cumsum(np.take_along_axis(p, order, -1), -1)  # [B, C] mass up to rank r
    # The whole mass is 1: float32 probabilities sum to 1 +- 1e-7, and a threshold at 1 would
    # otherwise take or leave a last-ranked class by rounding alone.
    mass = np.minimum(mass / mass[:, -1:], 1.0)
    mass[:, -1] = 1.0
    scores = np.empty_like(p)
    np.put_along_axis(scores, order, mass, -1)
    if method == "raps":
        ranks = np.empty_like(order)
        np.put_along_axis(ranks, order, np.arange(1, p.shape[1] + 1)[None], -1)
        scores = scores + penalty * np.maximum(ranks - k_reg, 0)
    return scores


def threshold(scores: np.ndarray, labels: np.ndarray, alpha: float = 0.1) -> float:
    """The conformal threshold of calibration `scores` `[n, C]` at `labels` `[n]`: their
    `ceil((n + 1)(1 - alpha))`-th smallest score (inf where that exceeds n: every set is then
    every class).

    Raises:
      ValueError: `alpha` outside (0, 1), labels of the wrong shape, type or range.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r} (0.1 for 90% coverage)")
    n, C = scores.shape
    labels = check_labels(labels, n, C)
    rank = math.ceil((n + 1) * (1 - alpha))
    if rank > n:
        return math.inf
    return float(np.sort(scores[np.arange(n), labels])[rank - 1])


def conformal(
    calibration_probs: np.ndarray,
    calibration_labels: np.ndarray,
    test: dict[str, tuple[np.ndarray, np.ndarray]],
    method: Method = "aps",
    alpha: float = 0.1,
    penalty: float = 0.01,
    k_reg: int = 5,
) -> dict[str, object]:
    """Calibrates `method` on `(calibration_probs, calibration_labels)` and evaluates its sets
    on each test set of `test` (`name -> (probs, labels)`).

    Returns:
      `{"threshold", NAME: {"coverage", "size"}, ...}`: the threshold, and per test set the
      fraction of examples whose set holds their label and the mean set size.
    """
    checks.count("k_reg", k_reg, minimum=0)
    q = threshold(
        nonconformity(calibration_probs, method, penalty, k_reg), calibration_labels, alpha
    )
    out: dict[str, object] = {"threshold": q}
    for name, (probs, labels) in test.items():
        sets = nonconformity(probs, method, penalty, k_reg) <= q  # [B, C]
        labels = check_labels(labels, *sets.shape)
        out[name] = {
            "coverage": float(sets[np.arange(len(labels)), labels].mean()),
            "size": float(sets.sum(-1).mean()),
        }
    return out
