"""Selective classification: the risk-coverage curve of a confidence score, its area (AURC,
Geifman et al. 2019), the area under the generalised risk-coverage curve (AUGRC, Traub et al.
2024) and the selective risk at fixed coverages.

Examples are accepted in decreasing confidence; examples of equal confidence are accepted
together (one point of the curve). At coverage `k / N` the selective risk is the error rate of
the `k` accepted examples and the generalised risk their errors over all `N` examples (the
joint probability of being accepted and wrong).
"""

from __future__ import annotations

import numpy as np

from hydra_jax.metrics.core import _check_confidence

COVERAGES = (0.8, 0.9, 0.95)


def risk_coverage(confidence: np.ndarray, correct: np.ndarray) -> dict[str, np.ndarray]:
    """The curve's points, one per distinct confidence (highest first): `coverage`, selective
    `risk` and `generalised` risk, each `[K]`, float64.

    Raises:
      ValueError: what `calibration` refuses of `confidence` and `correct`.
    """
    confidence, correct = _check_confidence(confidence, correct, 1)
    order = np.argsort(-confidence, kind="stable")
    confidence, errors = confidence[order], 1.0 - correct[order]
    last_of_tie = np.r_[np.nonzero(np.diff(confidence))[0], confidence.size - 1]
    accepted = last_of_tie + 1.0
    wrong = np.cumsum(errors)[last_of_tie]
    n = confidence.size
    return {"coverage": accepted / n, "risk": wrong / accepted, "generalised": wrong / n}


def selective(
    confidence: np.ndarray, correct: np.ndarray, coverages: tuple[float, ...] = COVERAGES
) -> dict[str, float]:
    """AURC, AUGRC and the selective risk at each of `coverages`.

    AURC is the right Riemann sum of the selective risk over coverage, `sum_j (c_j - c_{j-1})
    r_j`: without ties, Geifman et al.'s `1/N sum_k risk(k)`. AUGRC is the trapezoidal area
    under the generalised risk from `(0, 0)`, which equals Traub et al.'s closed form `(1 -
    AUROC_f) acc (1 - acc) + (1 - acc)^2 / 2` (AUROC_f: failure detection by the same score).
    `risk_C` (e.g. `risk_90`) is the selective risk at the first point whose coverage reaches C.

    Returns:
      `{"aurc", "augrc", "risk_80", ..., "aurc_tu", "augrc_tu"}` as fractions (the last two:
      `torch_uncertainty_areas`).

    Raises:
      ValueError: what `risk_coverage` refuses; a coverage outside (0, 1].
    """
    curve = risk_coverage(confidence, correct)
    c, r, g = curve["coverage"], curve["risk"], curve["generalised"]
    previous_c, previous_g = np.r_[0.0, c[:-1]], np.r_[0.0, g[:-1]]
    out = {
        "aurc": float(np.sum((c - previous_c) * r)),
        "augrc": float(np.sum((c - previous_c) * (g + previous_g) / 2)),
    }
    for coverage in coverages:
        if not 0 < coverage <= 1:
            raise ValueError(f"coverages must lie in (0, 1], got {coverage!r}")
        reached = np.nonzero(c >= coverage - 1e-12)[0][0]
        out[f"risk_{round(100 * coverage)}"] = float(r[reached])
    return out | torch_uncertainty_areas(confidence, correct)


def torch_uncertainty_areas(confidence: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """AURC and AUGRC as torch-uncertainty 0.13 computes them (`aurc_tu`, `augrc_tu`): the
    examples accepted one at a time in decreasing confidence (ties in a stable sort's order, not
    together), the risks integrated by the trapezoid rule over coverage `k / N`, `k = 1..N`, and
    divided by `1 - 1/N`, the width of that support. They differ from `selective`'s by about
    `risk / (2N)` and by how ties are accepted.

    Raises:
      ValueError: what `risk_coverage` refuses; fewer than two examples.
    """
    confidence, correct = _check_confidence(confidence, correct, 1)
    n = confidence.size
    if n < 2:
        raise ValueError(f"torch-uncertainty's areas need at least 2 examples, got {n}")
    errors = 1.0 - correct[np.argsort(-confidence, kind="stable")]
    coverage = np.arange(1, n + 1) / n
    risk = np.cumsum(errors) / np.arange(1, n + 1)
    trapezoid = lambda y: float(np.sum(np.diff(coverage) * (y[1:] + y[:-1]) / 2))  # noqa: E731
    width = 1 - 1 / n
    return {"aurc_tu": trapezoid(risk) / width, "augrc_tu": trapezoid(risk * coverage) / width}
