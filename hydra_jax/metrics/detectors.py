"""Feature-space OOD detectors, fitted on training features and labels, scoring test features.

Features are what a classifier's final linear layer reads (`ModelOutput.features`), `[N, D]`
for one model. Every score is "higher = more OOD", as `ood_score`'s. Each detector is fitted
(`fit`) on training data only and then scores any set (`score`); an ensemble's members are
fitted and scored one by one (`member_scores`), and a table shows the member mean of the score.

- `mahalanobis` (Lee et al. 2018): the smallest squared Mahalanobis distance to a class mean,
  under the covariance shared by the classes (the within-class scatter); the classes are those
  with training examples (a zero-shot study's held-out ones have none). The covariance is
  inverted as estimated (`covariance="pinv"`: the pseudo-inverse of the maximum-likelihood
  estimate, as Lee et al. and OpenOOD) or first shrunk towards a multiple of the identity
  (`"ledoit_wolf"`: Ledoit & Wolf 2004, scikit-learn's `LedoitWolf`), which bounds the weight
  of near-singular directions (features whose covariance spans many orders of magnitude).
- `relative_mahalanobis` (Ren et al. 2021): the smallest `MD_c(x) - MD_0(x)`, `MD_0` the
  distance to the mean of all training features under their own covariance.
- `knn` (Sun et al. 2022): the distance from the L2-normalised feature to its k-th nearest
  L2-normalised training feature (Euclidean; a monotone function of the cosine).
- `vim` (Wang et al. 2022): `alpha |x^P_perp| - logsumexp(logits)`, the norm of the feature's
  residual off the principal subspace (dimension `vim_dim`) of the training features centred
  at `u = -pinv(W) b`, scaled by `alpha` = mean training max-logit / mean training residual
  norm. The classifier's `W` and `b` are recovered from the training features and logits by
  least squares (`affine`): logits are an affine function of the features, so the fit is exact
  to rounding, and it is refused where it is not.
- `react` (Sun et al. 2021): the energy score `-logsumexp` of the logits recomputed by that
  classifier from the features clipped above at the `REACT_PERCENTILE`-th percentile of every
  training feature value (OpenOOD's and the paper's 90).
- `kl_matching` (Hendrycks et al. 2022): `min_c KL(p(x) || d_c)`, the divergence of the softmax
  from the nearest class template `d_c`, the mean training softmax of the examples predicted as
  `c` (the paper's rule and pytorch-ood's; the paper fits on validation outputs, here the
  training subset's).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from scipy.special import logsumexp, softmax

from hydra_jax import checks
from hydra_jax.metrics.cache import fitted_once
from hydra_jax.metrics.core import check_labels

Detector = Literal["mahalanobis", "relative_mahalanobis", "knn", "vim", "react", "kl_matching"]
DETECTORS: tuple[str, ...] = (
    "mahalanobis", "relative_mahalanobis", "knn", "vim", "react", "kl_matching"
)  # fmt: skip
REACT_PERCENTILE = 90.0
COVARIANCES = ("pinv", "ledoit_wolf")
ROWS = 2048  # examples scored at a time, so memory does not grow with the scored set


class CannotFitError(ValueError):
    """The training data are too few for a detector (fewer examples than it needs)."""


def _features(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be non-empty [N, D] features, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contain {int((~np.isfinite(x)).sum())} NaN/inf values")
    return x


def _normalised(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _squared_distances(x: np.ndarray, means: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """`[N, K]` squared Mahalanobis distances of `x` `[N, D]` to `means` `[K, D]`, expanded
    (`x'Px - 2 x'Pm + m'Pm`) so that no `[N, K, D]` array is made (1,000 classes of 768-d
    features would take 6 GB per 1,000 examples)."""
    xp, mp = x @ precision, means @ precision  # [N, D], [K, D] (precision is symmetric)
    own = np.einsum("ND,ND->N", xp, x)[:, None] + np.einsum("KD,KD->K", mp, means)[None]
    return np.maximum(own - 2 * xp @ means.T, 0.0)


def affine(features: np.ndarray, logits: np.ndarray, rtol: float = 1e-3) -> tuple:
    """`(W [D, C], b [C])` with `logits = features @ W + b`, by least squares on `[N, D]`
    features and `[N, C]` logits.

    Raises:
      CannotFitError: fewer examples than D + 1 (the map is not determined).
      ValueError: logits that the fit misses by more than `rtol` of their scale (not affine
        in these features).
    """
    features, logits = _features(features, "features"), _features(logits, "logits")
    N, D = features.shape
    if N <= D:
        raise CannotFitError(
            f"recovering the classifier needs more examples than feature dimensions + 1: "
            f"{N} examples, {D} dimensions"
        )
    design = np.concatenate([features, np.ones((N, 1))], 1)
    solution = np.linalg.lstsq(design, logits, rcond=None)[0]
    miss = np.abs(design @ solution - logits).max()
    scale = np.abs(logits).max() or 1.0
    if miss > rtol * scale:
        raise ValueError(
            f"the logits are not an affine function of the features (least-squares residual "
            f"{miss:.3g} of logits up to {scale:.3g}): not a linear classifier's input"
        )
    return solution[:-1], solution[-1]


def fit(
    detector: Detector,
    features: np.ndarray,
    labels: np.ndarray,
    logits: np.ndarray,
    num_classes: int,
    k: int = 50,
    vim_dim: int = 0,
    covariance: str = "pinv",
) -> dict[str, Any]:
    """The statistics of `detector` from training `features` `[N, D]`, `labels` `[N]` and
    `logits` `[N, C]` (`k`: KNN's neighbour; `vim_dim`: ViM's principal dimensions, 0 = D / 2;
    `covariance`: the Mahalanobis detectors' estimator, `COVARIANCES`).

    Raises:
      ValueError: an unknown detector or covariance, bad shapes, `vim_dim` outside [1, D).
      CannotFitError: `k` above the number of training examples (KNN), no more examples than
        feature dimensions (ViM).
    """
    features = _features(features, "training features")
    N, D = features.shape
    labels = check_labels(labels, N, num_classes)
    if detector in ("mahalanobis", "relative_mahalanobis"):
        if covariance not in COVARIANCES:
            raise ValueError(f"covariance: {covariance!r}; one of {', '.join(COVARIANCES)}")
        classes, index = np.unique(labels, return_inverse=True)  # those with training examples
        means = np.stack([features[labels == c].mean(0) for c in classes])
        stats = {"means": means, "precision": _precision(features - means[index], covariance)}
        if detector == "relative_mahalanobis":
            mean0 = features.mean(0)
            stats |= {"mean0": mean0, "precision0": _precision(features - mean0, covariance)}
        return stats
    if detector == "knn":
        checks.count("k", k)
        if k > N:
            raise CannotFitError(f"KNN's k = {k} exceeds the {N} training examples")
        return {"bank": _normalised(features), "k": k}
    if detector == "vim":
        W, b = affine(features, logits)
        dim = vim_dim or D // 2
        if not 1 <= dim < D:
            raise ValueError(f"ViM's principal dimension must lie in [1, {D}), got {dim}")
        u = -np.linalg.pinv(W.T) @ b  # [D]: the origin, where the logits vanish
        centred = features - u
        covariance = centred.T @ centred / N
        values, vectors = np.linalg.eigh(covariance)  # ascending
        residual = vectors[:, np.argsort(-values)[dim:]]  # [D, D - dim]
        norms = np.linalg.norm(centred @ residual, axis=-1)
        alpha = np.asarray(logits, np.float64).max(-1).mean() / norms.mean()
        return {"u": u, "residual": residual, "alpha": float(alpha)}
    if detector == "react":
        W, b = affine(features, logits)
        return {"W": W, "b": b, "clip": float(np.percentile(features, REACT_PERCENTILE))}
    if detector == "kl_matching":
        p = softmax(_features(logits, "training logits"), axis=-1)
        predicted = p.argmax(-1)
        return {"templates": np.stack([p[predicted == c].mean(0) for c in np.unique(predicted)])}
    raise ValueError(f"unknown detector {detector!r}; choose one of {DETECTORS}")


def _precision(centred: np.ndarray, covariance: str) -> np.ndarray:
    """The inverse covariance of `centred` `[N, D]` (rows already centred): the pseudo-inverse
    of `X'X / N`, or of its Ledoit-Wolf shrinkage `(1 - s) S + s mu I` with `mu = tr(S) / D`
    and `s` their estimate of the optimal intensity (as scikit-learn's `ledoit_wolf_shrinkage`
    on centred data)."""
    N, D = centred.shape
    empirical = centred.T @ centred / N
    if covariance == "pinv":
        return np.linalg.pinv(empirical)
    squared = centred**2
    variances = squared.sum(0) / N  # [D]
    mu = variances.sum() / D
    beta = (squared.T @ squared).sum() / N  # sum over i, j of (1/N) sum_n x_ni^2 x_nj^2
    delta = (empirical**2).sum()  # the squared Frobenius norm of S
    beta = (beta - delta) / (D * N)
    delta = (delta - 2 * mu * variances.sum() + D * mu**2) / D
    shrinkage = 0.0 if beta == 0 else min(beta, delta) / delta
    shrunk = (1 - shrinkage) * empirical + shrinkage * mu * np.eye(D)
    return np.linalg.pinv(shrunk)


def score(
    detector: Detector, stats: dict[str, Any], features: np.ndarray, logits: np.ndarray | None
) -> np.ndarray:
    """Scores `[N]` (higher = more OOD) of `features` `[N, D]` (`logits` `[N, C]`: ViM) by a
    detector `fit` returned `stats` for."""
    x = _features(features, "features")
    if len(x) > ROWS:  # in blocks: the distance arrays are [ROWS, K] or [ROWS, N_train]
        z = None if logits is None else np.asarray(logits)
        blocks = [slice(i, i + ROWS) for i in range(0, len(x), ROWS)]
        return np.concatenate(
            [score(detector, stats, x[b], None if z is None else z[b]) for b in blocks]
        )
    if detector == "mahalanobis":
        return _squared_distances(x, stats["means"], stats["precision"]).min(-1)
    if detector == "relative_mahalanobis":
        to_classes = _squared_distances(x, stats["means"], stats["precision"])
        to_all = _squared_distances(x, stats["mean0"][None], stats["precision0"])
        return (to_classes - to_all).min(-1)
    if detector == "knn":
        # |a - b|^2 = 2 - 2 a.b for unit vectors: [N, N_train] without an [N, N_train, D] array
        squared = np.maximum(2.0 - 2.0 * (_normalised(x) @ stats["bank"].T), 0.0)
        kth = np.partition(squared, stats["k"] - 1, axis=-1)[:, stats["k"] - 1]
        return np.sqrt(kth)
    if detector == "vim":
        z = np.asarray(logits, np.float64)
        residual = np.linalg.norm((x - stats["u"]) @ stats["residual"], axis=-1)
        return stats["alpha"] * residual - logsumexp(z, axis=-1)
    if detector == "react":
        return -logsumexp(np.minimum(x, stats["clip"]) @ stats["W"] + stats["b"], axis=-1)
    if detector == "kl_matching":
        p = softmax(np.asarray(logits, np.float64), axis=-1)
        log_q = np.log(np.maximum(stats["templates"], np.finfo(np.float64).tiny))  # [K, C]
        own_entropy = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)
        kl = own_entropy[:, None] - p @ log_q.T  # [N, K]: KL(p || d_k) = sum p log p - p log d_k
        return kl.min(-1)
    raise ValueError(f"unknown detector {detector!r}; choose one of {DETECTORS}")


def member_scores(
    detector: Detector,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    sets: dict[str, tuple[np.ndarray, np.ndarray]],
    num_classes: int,
    k: int = 50,
    vim_dim: int = 0,
    covariance: str = "pinv",
    fitted: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Per set of `sets` (`name -> (features [N, M, D], logits [N, M, C])`), scores `[N, M]`
    of each member's detector, fitted on that member's `train` (`(features [N, M, D], labels
    [N], logits [N, M, C])`). `fitted`, where given, keeps each fit by what it was fitted on
    (a digest of the arrays and settings), so scoring other sets again fits nothing anew."""
    features, labels, logits = train
    M = np.shape(features)[1]
    out: dict[str, list[np.ndarray]] = {name: [] for name in sets}
    for m in range(M):
        arguments = (detector, features[:, m], labels, logits[:, m], num_classes, k, vim_dim,
                     covariance)  # fmt: skip
        stats = fitted_once(fitted, fit, *arguments)
        for name, (x, z) in sets.items():
            out[name].append(score(detector, stats, x[:, m], z[:, m]))
    return {name: np.stack(s, 1) for name, s in out.items()}
