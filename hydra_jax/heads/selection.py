"""Which heads to keep: global top-k by pruning ratio, or top-n per layer."""

from __future__ import annotations

import numpy as np


def check_scores(scores: np.ndarray) -> np.ndarray:
    """Float64 finite `[L, N]` head scores, or a ValueError naming what is wrong."""
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [L, N], got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores contain NaN/inf")
    return scores


def keep_mask(
    scores: np.ndarray, ratio: float | None = None, keep_per_layer: int | None = None
) -> np.ndarray:
    """Boolean `[L, N]` of heads to keep (higher score = kept).

    Args:
      scores: `[L, N]` importance.
      ratio: fraction of ALL heads to remove, in [0, 1); the lowest-scoring
        `round(ratio * L * N)` heads go, wherever they are (a layer may lose every head).
      keep_per_layer: instead, keep the top n heads of every layer.

    Ties are broken by position (earlier layer, then earlier head, is removed first).

    Raises:
      ValueError: wrong shape, NaN scores, both or neither option, or an option out of range.
    """
    scores = check_scores(scores)
    L, N = scores.shape
    if (ratio is None) == (keep_per_layer is None):
        raise ValueError("give exactly one of ratio= and keep_per_layer=")
    keep = np.ones((L, N), bool)
    if ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.integer, np.floating)):
            raise ValueError(f"pruning ratio must be a number in [0, 1), got {ratio!r}")
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"pruning ratio must be in [0, 1), got {ratio}")
        remove = np.argsort(scores.reshape(-1), kind="stable")[: round(ratio * L * N)]
        keep.reshape(-1)[remove] = False
        return keep
    if isinstance(keep_per_layer, bool) or not isinstance(keep_per_layer, (int, np.integer)):
        raise ValueError(f"keep_per_layer must be an integer, got {keep_per_layer!r}")
    if not 1 <= keep_per_layer <= N:
        raise ValueError(f"keep_per_layer must be in [1, {N}], got {keep_per_layer}")
    remove = np.argsort(scores, axis=1, kind="stable")[:, : N - keep_per_layer]
    np.put_along_axis(keep, remove, False, axis=1)
    return keep
