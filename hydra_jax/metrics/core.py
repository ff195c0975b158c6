"""Classification, calibration and OOD-detection metrics as pure numpy functions (float64),
matching torch-uncertainty conventions.

Notation: `p_m` member softmax `[B, M, C]`, `p = mean_m p_m` `[B, C]`, `y_hat = argmax p`.
A single model is the case M = 1: `[B, C]` inputs are read as `[B, 1, C]`.
OOD detection treats OOD as the positive class; every score is "higher = more OOD".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from hydra_jax import checks

_TINY = np.finfo(np.float64).tiny  # log(tiny) = -708: NLL and KL stay finite at p = 0


def _member_probs(probs: np.ndarray) -> np.ndarray:
    """`[B, C]` or `[B, M, C]` -> float64 `[B, M, C]`, refusing NaN/inf and empty input."""
    probs = np.asarray(probs, np.float64)
    if probs.ndim == 2:
        probs = probs[:, None, :]
    if probs.ndim != 3:
        raise ValueError(f"probs must be [B, C] or [B, M, C], got shape {probs.shape}")
    if probs.shape[0] == 0:
        raise ValueError("probs is empty: no examples to evaluate")
    bad = ~np.isfinite(probs)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise ValueError(
            f"probs contain {int(bad.sum())} NaN/inf values in {rows.size} examples "
            f"(first: {rows[:5].tolist()}); refusing to average them away"
        )
    return probs


def _check_distributions(members: np.ndarray, atol: float = 1e-3) -> None:
    """Refuses `[B, M, C]` rows that are not probability distributions (logits, say)."""
    negative = np.nonzero((members < 0).any(axis=(1, 2)))[0]
    sums = members.sum(-1)  # [B, M]
    off = np.nonzero((np.abs(sums - 1) > atol).any(axis=1))[0]
    if negative.size or off.size:
        bad = negative if negative.size else off
        what = "negative values" if negative.size else f"rows summing to {sums[bad[0]].tolist()}"
        near = not negative.size and np.abs(sums[off] - 1).max() < 0.02
        hint = (  # a bf16 softmax sums to 1 within about 0.5%
            "a softmax computed in bf16 or float16? compute it in float32"
            if near
            else "pass softmax(logits), not logits"
        )
        raise ValueError(
            f"probs are not probabilities: examples {bad[:5].tolist()} have {what} "
            f"(tolerance {atol}); {hint}"
        )


def check_labels(labels: np.ndarray, num_examples: int, num_classes: int) -> np.ndarray:
    """`labels` as `[B]` integer classes in `[0, C)`, or a ValueError naming the first offending
    examples. Shared by the metrics and by head scoring."""
    labels = np.asarray(labels)
    if labels.shape != (num_examples,):
        raise ValueError(f"labels must be [B] = [{num_examples}], got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integer classes, got dtype {labels.dtype}")
    outside = np.nonzero((labels < 0) | (labels >= num_classes))[0]
    if outside.size:
        raise ValueError(
            f"labels must be classes in [0, {num_classes}); examples {outside[:5].tolist()} have "
            f"{labels[outside[:5]].tolist()}"
        )
    return labels


def _check_confidence(
    confidence: np.ndarray, correct: np.ndarray, num_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 `[N]` confidences in [0, 1] and 0/1 correctness, and a positive bin count."""
    checks.count("num_bins", num_bins)
    confidence = np.asarray(confidence, np.float64)
    correct = np.asarray(correct, np.float64)
    if confidence.ndim != 1 or correct.ndim != 1:
        raise ValueError(
            f"confidence and correct must be 1-D [N], got shapes {confidence.shape} and "
            f"{correct.shape}"
        )
    if confidence.size != correct.size:
        raise ValueError(f"{confidence.size} confidences but {correct.size} correct flags")
    if confidence.size == 0:
        raise ValueError("confidence is empty: no examples to evaluate")
    if not np.all(np.isfinite(confidence)):
        raise ValueError(f"confidence contains {int((~np.isfinite(confidence)).sum())} NaN/inf")
    outside = np.nonzero((confidence < -1e-6) | (confidence > 1 + 1e-6))[0]
    if outside.size:
        raise ValueError(
            f"confidences must lie in [0, 1]; examples {outside[:5].tolist()} have "
            f"{confidence[outside[:5]].tolist()}"
        )
    if not np.all((correct == 0) | (correct == 1)):
        raise ValueError("correct must be 0/1 (or bool) per example")
    return confidence, correct


def _entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) over the last axis, with 0 log 0 = 0."""
    return -np.sum(np.where(p > 0, p * np.log(np.maximum(p, _TINY)), 0.0), axis=-1)


def _bin_gaps(confidence: np.ndarray, correct: np.ndarray, bins: list[np.ndarray]) -> tuple:
    """Per non-empty bin: weight n_b / N and gap |acc_b - conf_b|."""
    n = confidence.size
    weights, gaps = [], []
    for index in bins:
        if index.size:
            weights.append(index.size / n)
            gaps.append(abs(correct[index].mean() - confidence[index].mean()))
    return np.array(weights), np.array(gaps)


def calibration(
    confidence: np.ndarray, correct: np.ndarray, num_bins: int = 15
) -> dict[str, float]:
    """ECE (equal-width bins), aECE (equal-mass bins) and MCE of top-label confidence.

    Equal-width bins are `[b/n, (b+1)/n)`, the last one closed: a confidence of exactly 1.0
    falls in bin n (the textbook rule). torchmetrics, which torch-uncertainty uses, gives 1.0
    a bin of its own, so the two differ when some confidence is exactly 1.0 (rare in float32
    softmax outputs, but possible). Equal-mass bins split the confidence-sorted examples into
    `num_bins` groups whose sizes differ by at most one.

    Raises:
      ValueError: shapes that differ or are not 1-D, no examples, confidences outside [0, 1]
        or not finite, correctness that is not 0/1, or `num_bins` < 1.
    """
    confidence, correct = _check_confidence(confidence, correct, num_bins)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    which = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, num_bins - 1)
    width_bins = [np.nonzero(which == b)[0] for b in range(num_bins)]
    w, gap = _bin_gaps(confidence, correct, width_bins)
    mass_bins = np.array_split(np.argsort(confidence, kind="stable"), num_bins)
    w_mass, gap_mass = _bin_gaps(confidence, correct, mass_bins)
    return {
        "ece": float(np.sum(w * gap)),
        "aece": float(np.sum(w_mass * gap_mass)),
        "mce": float(np.max(gap)),
    }


def classwise_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> float:
    """Classwise ECE (Kull et al. 2019): the mean over classes c of the equal-width-binned ECE
    of `p_c` as the probability that the label is c, on the member-mean probabilities:
    `1/C sum_c sum_b n_bc / N |mean_b 1[y = c] - mean_b p_c|`.

    Refuses what `classification` refuses.
    """
    members = _member_probs(probs)
    _check_distributions(members)
    B, _, C = members.shape
    labels = check_labels(labels, B, C)
    checks.count("num_bins", num_bins)
    p = members.mean(1)  # [B, C]
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, num_bins - 1)  # [B, C]
    hit = (labels[:, None] == np.arange(C)).astype(np.float64)  # [B, C]
    total = 0.0
    for c in range(C):
        count = np.bincount(which[:, c], minlength=num_bins)
        gap = np.bincount(which[:, c], hit[:, c] - p[:, c], num_bins)  # n_b (acc_b - conf_b)
        total += np.abs(gap[count > 0]).sum() / B
    return float(total / C)


def reliability(confidence: np.ndarray, correct: np.ndarray, num_bins: int = 15) -> dict:
    """Per equal-width bin: count, mean confidence and accuracy (NaN where empty), for plots.

    Refuses what `calibration` refuses.
    """
    confidence, correct = _check_confidence(confidence, correct, num_bins)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    which = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, num_bins - 1)
    count = np.bincount(which, minlength=num_bins)
    with np.errstate(invalid="ignore"):
        conf = np.bincount(which, confidence, num_bins) / count
        acc = np.bincount(which, correct, num_bins) / count
    return {"edges": edges, "count": count, "confidence": conf, "accuracy": acc}


def classification(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> dict[str, float]:
    """Accuracy, NLL, Brier, ECE/aECE/MCE, predictive entropy; diversity when M > 1.

    Args:
      probs: member probabilities `[B, M, C]`, or `[B, C]` for a single model.
      labels: `[B]` integer classes.
      num_bins: calibration bins.

    Returns:
      Fractions and nats: `acc, nll, brier, ece, aece, mce, cwece` (`classwise_ece`),
      `entropy`, and for M > 1
      `mutual_information, disagreement, pairwise_kl`.

    Raises:
      ValueError: NaN/inf probabilities, empty input, inputs that are not probabilities
        (negative, or rows not summing to 1: logits?), or labels of the wrong shape, type or
        range.
    """
    members = _member_probs(probs)
    _check_distributions(members)
    B, M, C = members.shape
    labels = check_labels(labels, B, C)
    p = members.mean(axis=1)  # [B, C]
    prediction = p.argmax(-1)
    confidence = p.max(-1)
    correct = (prediction == labels).astype(np.float64)
    onehot = np.eye(C)[labels]
    out = {
        "acc": float(correct.mean()),
        "nll": float(-np.log(np.maximum(p[np.arange(B), labels], _TINY)).mean()),
        "brier": float(np.sum((p - onehot) ** 2, axis=-1).mean()),
        **calibration(confidence, correct, num_bins),
        "cwece": classwise_ece(members, labels, num_bins),
        "entropy": float(_entropy(p).mean()),
    }
    if M > 1:
        out.update(diversity(members))
    return out


def diversity(members: np.ndarray) -> dict[str, float]:
    """Mutual information, argmax disagreement and mean pairwise KL of members `[B, M, C]`.

    MI is `H(p) - mean_m H(p_m)` (>= 0 by concavity; clipped at 0 against rounding).
    Disagreement is, per example, the fraction of unordered member pairs whose argmax differ.
    Pairwise KL is the mean of `KL(p_m || p_n)` over ordered pairs m != n.
    """
    members = _member_probs(members)
    _check_distributions(members)
    M = members.shape[1]
    if M < 2:
        raise ValueError(f"diversity needs at least two members, got M={M}")
    mi = np.maximum(_entropy(members.mean(1)) - _entropy(members).mean(1), 0.0)
    votes = members.argmax(-1)  # [B, M]
    m, n = np.triu_indices(M, k=1)
    disagreement = (votes[:, m] != votes[:, n]).mean(-1)
    log_p = np.log(np.maximum(members, _TINY))  # [B, M, C]
    kl = np.einsum("BMC,BMNC->BMN", members, log_p[:, :, None, :] - log_p[:, None, :, :])
    off_diagonal = ~np.eye(M, dtype=bool)
    return {
        "mutual_information": float(mi.mean()),
        "disagreement": float(disagreement.mean()),
        "pairwise_kl": float(kl[:, off_diagonal].mean()),
    }


# ----------------------------------------------------------------------------- OOD scores

OodScore = Literal["msp", "entropy", "mi", "energy", "max_logit", "gen"]
GEN_GAMMA, GEN_TOP = 0.1, 100  # GEN's exponent and the most probable classes it sums over


def ood_score(
    probs: np.ndarray, kind: OodScore = "msp", logits: np.ndarray | None = None
) -> np.ndarray:
    """Per-example OOD scores `[B]`, higher = more OOD.

    Args:
      probs: member probabilities `[B, M, C]` or `[B, C]`.
      kind: `msp` (-max_c p_c), `entropy` (H(p)), `mi` (mutual information between members),
        `energy` (-logsumexp_c of the member-mean logits; needs `logits`), `max_logit`
        (-max_c of the member-mean logits, Hendrycks et al. 2022; needs `logits`), `gen` (the
        generalised entropy of Liu et al. 2023, `sum_j p_j^g (1 - p_j)^g` over the `GEN_TOP`
        most probable classes, `g = GEN_GAMMA`: their defaults, as OpenOOD's).
      logits: member logits, same shape as `probs`, for `energy` and `max_logit`.

    Raises:
      ValueError: NaN/inf or empty `probs`, or `probs` that are not probabilities (logits?).
    """
    members = _member_probs(probs)
    _check_distributions(members)
    p = members.mean(1)
    if kind == "msp":
        return -p.max(-1)
    if kind == "entropy":
        return _entropy(p)
    if kind == "mi":
        return np.maximum(_entropy(p) - _entropy(members).mean(1), 0.0)
    if kind == "gen":
        top = -np.sort(-p, axis=-1)[:, :GEN_TOP]
        return (top**GEN_GAMMA * np.maximum(1.0 - top, 0.0) ** GEN_GAMMA).sum(-1)
    if kind in ("energy", "max_logit"):
        if logits is None:
            raise ValueError(f"the {kind} score needs logits")
        mean_logits = _member_probs(logits).mean(1)  # [B, C]
        top = mean_logits.max(-1, keepdims=True)
        if kind == "max_logit":
            return -top[:, 0]
        return -(top[:, 0] + np.log(np.exp(mean_logits - top).sum(-1)))
    raise ValueError(
        f"unknown OOD score {kind!r}; choose msp, entropy, mi, energy, max_logit or gen"
    )


def _roc_points(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple:
    """ROC at every distinct threshold, from (0, 0): (fpr, tpr, tp, fp) with OOD positive."""
    scores = np.concatenate([id_scores, ood_scores])
    positive = np.concatenate([np.zeros(id_scores.size), np.ones(ood_scores.size)])
    order = np.argsort(-scores, kind="stable")
    scores, positive = scores[order], positive[order]
    last_of_tie = np.r_[np.nonzero(np.diff(scores))[0], scores.size - 1]
    tp = np.r_[0.0, np.cumsum(positive)[last_of_tie]]
    fp = np.r_[0.0, np.cumsum(1 - positive)[last_of_tie]]
    return fp / fp[-1], tp / tp[-1], tp, fp


def _check_scores(scores: np.ndarray, name: str) -> np.ndarray:
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 1:
        raise ValueError(f"{name} must be 1-D [N], one score per example; got {scores.shape}")
    if scores.size < 2:
        raise ValueError(f"{name} has {scores.size} example(s); OOD metrics need at least 2")
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"{name} contains {int((~np.isfinite(scores)).sum())} NaN/inf scores")
    return scores


def ood(
    id_scores: np.ndarray,
    ood_scores: np.ndarray,
    fpr95_convention: Literal["first_above", "closest"] = "first_above",
) -> dict[str, float]:
    """AUROC, AUPR-Out, AUPR-In and FPR95 for separating OOD from ID by score (higher = OOD).

    AUROC counts ties as half (as scikit-learn). AUPR (`aupr`, AUPR-Out) is average precision
    with OOD positive; AUPR-In (`aupr_in`, as OpenOOD reports beside it) with ID positive and
    the negated score, both as scikit-learn's `average_precision_score`.
    FPR95: the fraction of ID examples flagged at the first ROC point whose OOD recall reaches
    95% (`"first_above"`, the convention of torch-uncertainty 0.13 and pytorch-ood 0.4), or with
    `fpr95_convention="closest"` at the point whose recall is closest to 95% (ties to the larger
    FPR; the older rule of earlier torch-uncertainty releases).

    Returns:
      `{"auroc", "aupr", "aupr_in", "fpr95"}` as fractions in [0, 1].
    """
    id_scores = _check_scores(id_scores, "id_scores")
    ood_scores = _check_scores(ood_scores, "ood_scores")
    curve = _curves(id_scores, ood_scores)
    fpr, tpr = curve["fpr"], curve["tpr"]
    auroc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    aupr = _average_precision(curve)
    aupr_in = _average_precision(_curves(-ood_scores, -id_scores))
    if fpr95_convention == "closest":
        distance = np.abs(tpr - 0.95)
        candidates = np.nonzero(np.isclose(distance, distance.min(), rtol=0, atol=1e-12))[0]
        fpr95 = float(fpr[candidates].max())
    elif fpr95_convention == "first_above":
        fpr95 = float(fpr[np.argmax(tpr >= 0.95)])
    else:
        raise ValueError(f"unknown fpr95_convention {fpr95_convention!r}")
    return {"auroc": auroc, "aupr": aupr, "aupr_in": aupr_in, "fpr95": fpr95}


def ood_curves(id_scores: np.ndarray, ood_scores: np.ndarray) -> dict[str, np.ndarray]:
    """The ROC (`fpr`, `tpr`) and precision-recall (`recall`, `precision`) curves of `ood`'s
    AUROC and AUPR (OOD positive), one point per distinct threshold, from the highest."""
    return _curves(_check_scores(id_scores, "id_scores"), _check_scores(ood_scores, "ood_scores"))


def _curves(negatives: np.ndarray, positives: np.ndarray) -> dict[str, np.ndarray]:
    fpr, tpr, tp, fp = _roc_points(negatives, positives)
    return {"fpr": fpr, "tpr": tpr, "recall": tpr[1:], "precision": tp[1:] / (tp[1:] + fp[1:])}


def _average_precision(curve: dict[str, np.ndarray]) -> float:
    """Average precision: each step of recall times the precision it reaches (`_curves`)."""
    return float(np.sum(np.diff(curve["tpr"]) * curve["precision"]))


def misclassification(
    probs: np.ndarray, labels: np.ndarray, kind: OodScore = "msp"
) -> dict[str, float]:
    """Failure prediction: AUROC, AUPR and FPR95 for separating wrong predictions (positive)
    from correct ones by the uncertainty score `kind` of `ood_score` (MSP: -max_c p_c), and
    `aupr_in` with the correct ones positive.

    Raises:
      ValueError: every prediction is right, or every one is wrong (nothing to separate); and
        what `classification` refuses (probabilities that are not, labels of the wrong shape,
        type or range).
    """
    members = _member_probs(probs)
    _check_distributions(members)
    B, _, C = members.shape
    labels = check_labels(labels, B, C)
    wrong = members.mean(1).argmax(-1) != labels
    if wrong.all() or not wrong.any():
        raise ValueError(
            f"misclassification detection needs right and wrong predictions; "
            f"{int(wrong.sum())} of {wrong.size} are wrong"
        )
    scores = ood_score(members, kind)
    return ood(scores[~wrong], scores[wrong])


def auroc_difference(
    id_a: np.ndarray,
    ood_a: Sequence[np.ndarray],
    id_b: np.ndarray,
    ood_b: Sequence[np.ndarray],
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Mean-over-OOD-sets AUROC of method a minus method b, with a paired bootstrap interval.

    Both methods scored the same examples: `id_a[i]` and `id_b[i]` are one ID example's scores,
    `ood_a[k][j]` and `ood_b[k][j]` one example of OOD set k. Each resample draws the ID examples
    and each OOD set's examples with replacement (in that order, from `default_rng(seed)`), the
    same draw for both methods. The interval covers test-set sampling only, not training seeds.

    Returns:
      `{"difference", "low", "high"}`: the full-sample difference and the percentile interval at
      `level`, as fractions.

    Raises:
      ValueError: the methods' scores are not paired (different sets or set sizes), scores that
        are not finite 1-D arrays, `resamples` < 1 or `level` outside (0, 1).
    """
    return pooled_auroc_difference([(id_a, ood_a, id_b, ood_b)], resamples, level, seed)


Run = tuple[np.ndarray, Sequence[np.ndarray], np.ndarray, Sequence[np.ndarray]]


def pooled_auroc_difference(
    runs: Sequence[Run], resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """`auroc_difference` pooled over runs (training seeds): the mean over runs of each run's
    difference, with a bootstrap that redraws every run's test examples in each resample (paired
    within a run, runs in order). With one run, exactly `auroc_difference`.

    Args:
      runs: per run `(id_a, ood_a, id_b, ood_b)`, as `auroc_difference` takes them.
    """
    if not runs:
        raise ValueError("no runs to pool")
    checks.count("resamples", resamples)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r} (0.95 for 95%)")
    checked = [
        _paired(*run, prefix=f"run {r}: " if len(runs) > 1 else "") for r, run in enumerate(runs)
    ]

    def difference(run: Run, i: np.ndarray, js: list[np.ndarray]) -> float:
        id_a, ood_a, id_b, ood_b = run
        a = [ood(id_a[i], s[j])["auroc"] for s, j in zip(ood_a, js, strict=True)]
        b = [ood(id_b[i], s[j])["auroc"] for s, j in zip(ood_b, js, strict=True)]
        return float(np.mean(a) - np.mean(b))

    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        per_run = []
        for run in checked:
            i = rng.integers(0, run[0].size, run[0].size)
            per_run.append(difference(run, i, [rng.integers(0, s.size, s.size) for s in run[1]]))
        draws.append(float(np.mean(per_run)))
    low, high = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
    full = np.mean(
        [
            difference(run, np.arange(run[0].size), [np.arange(s.size) for s in run[1]])
            for run in checked
        ]
    )
    return {"difference": float(full), "low": float(low), "high": float(high)}


def _paired(
    id_a: np.ndarray,
    ood_a: Sequence[np.ndarray],
    id_b: np.ndarray,
    ood_b: Sequence[np.ndarray],
    prefix: str = "",
) -> Run:
    """Checked scores of one run: finite 1-D arrays, the same sets and sizes for a and b."""
    if len(ood_a) != len(ood_b) or not ood_a:
        raise ValueError(f"{prefix}method a has {len(ood_a)} OOD sets and method b {len(ood_b)}")
    id_a, id_b = _check_scores(id_a, "id_a"), _check_scores(id_b, "id_b")
    ood_a = [_check_scores(s, f"ood_a[{k}]") for k, s in enumerate(ood_a)]
    ood_b = [_check_scores(s, f"ood_b[{k}]") for k, s in enumerate(ood_b)]
    pairs = {"ID": (id_a, id_b)}
    pairs.update({f"OOD set {k}": pair for k, pair in enumerate(zip(ood_a, ood_b, strict=True))})
    for name, (a, b) in pairs.items():
        if a.shape != b.shape:
            raise ValueError(
                f"{prefix}{name}: {a.size} scores for method a but {b.size} for method b"
            )
    return id_a, ood_a, id_b, ood_b
