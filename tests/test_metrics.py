"""Metrics against scikit-learn, hand-worked cases and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from hydra_jax import metrics

# Four binary examples worked by hand: confidences 0.9 (right), 0.9 (wrong), 0.65, 0.7 (right).
HAND_PROBS = np.array([[0.1, 0.9], [0.1, 0.9], [0.35, 0.65], [0.7, 0.3]])
HAND_LABELS = np.array([1, 0, 1, 0])


def test_hand_worked_single_model():
    m = metrics.classification(HAND_PROBS, HAND_LABELS)
    assert m["acc"] == pytest.approx(0.75)
    assert m["nll"] == pytest.approx(-(np.log(0.9) + np.log(0.1) + np.log(0.65) + np.log(0.7)) / 4)
    assert m["brier"] == pytest.approx((0.02 + 1.62 + 0.245 + 0.18) / 4)
    # Bins 13 (two at 0.9, accuracy 0.5), 9 (0.65) and 10 (0.7).
    assert m["ece"] == pytest.approx(0.5 * 0.4 + 0.25 * 0.35 + 0.25 * 0.3)
    assert m["mce"] == pytest.approx(0.4)
    # Equal mass with 4 examples in 15 bins: one example per bin.
    assert m["aece"] == pytest.approx((0.1 + 0.9 + 0.35 + 0.3) / 4)
    h = lambda q: -(q * np.log(q) + (1 - q) * np.log(1 - q))  # noqa: E731
    assert m["entropy"] == pytest.approx((2 * h(0.9) + h(0.65) + h(0.7)) / 4)
    assert "mutual_information" not in m


def test_hand_worked_ensemble():
    members = np.array([[[0.8, 0.2], [0.2, 0.8]], [[0.6, 0.4], [0.7, 0.3]]])  # [B=2, M=2, C=2]
    m = metrics.classification(members, np.array([0, 0]))
    h = lambda q: -(q * np.log(q) + (1 - q) * np.log(1 - q))  # noqa: E731
    mi_0 = np.log(2) - h(0.8)  # the mean is [0.5, 0.5]
    mi_1 = h(0.65) - (h(0.6) + h(0.7)) / 2
    assert m["mutual_information"] == pytest.approx((mi_0 + mi_1) / 2)
    assert m["disagreement"] == pytest.approx(0.5)  # example 0 disagrees, example 1 agrees
    kl_0 = 0.6 * np.log(4)  # KL([.8,.2] || [.2,.8]), symmetric here
    kl_1 = (
        0.6 * np.log(6 / 7) + 0.4 * np.log(4 / 3) + 0.7 * np.log(7 / 6) + 0.3 * np.log(3 / 4)
    ) / 2
    assert m["pairwise_kl"] == pytest.approx((kl_0 + kl_1) / 2)
    assert m["acc"] == pytest.approx(1.0)  # example 0's mean is a tie, broken to class 0


def test_nll_is_finite_at_zero_probability():
    m = metrics.classification(np.array([[1.0, 0.0], [0.5, 0.5]]), np.array([1, 0]))
    assert np.isfinite(m["nll"]) and m["nll"] > 300


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_probabilities_are_reported_not_averaged(bad):
    probs = HAND_PROBS.copy()
    probs[2, 0] = bad
    with pytest.raises(ValueError, match=r"1 NaN/inf values in 1 examples \(first: \[2\]\)"):
        metrics.classification(probs, HAND_LABELS)
    with pytest.raises(ValueError, match="NaN/inf"):
        metrics.ood_score(probs)


def test_ood_set_with_one_example_is_refused():
    with pytest.raises(ValueError, match="ood_scores has 1 example"):
        metrics.ood(np.arange(5.0), np.array([3.0]))


def test_labels_of_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"labels must be \[B\] = \[4\]"):
        metrics.classification(HAND_PROBS, np.zeros(3, int))


@pytest.mark.parametrize("labels", [[0, 1, 2, 1], [0, -1, 1, 1]])
def test_labels_out_of_range_are_refused(labels):
    with pytest.raises(ValueError, match=r"labels must be classes in \[0, 2\); examples \[\d\]"):
        metrics.classification(HAND_PROBS, np.array(labels))
    with pytest.raises(ValueError, match="labels must be integer classes"):
        metrics.classification(HAND_PROBS, np.array(HAND_LABELS, float))


def test_logits_and_unnormalised_rows_are_refused_with_a_softmax_hint():
    logits = np.log(HAND_PROBS) + 1.5  # rows of logits: negative and not summing to 1
    with pytest.raises(ValueError, match=r"not probabilities: .*negative.*softmax\(logits\)"):
        metrics.classification(logits, HAND_LABELS)
    scaled = HAND_PROBS * 1.01  # non-negative, but rows sum to 1.01: a low-precision softmax?
    with pytest.raises(ValueError, match=r"examples \[0, 1, 2, 3\] have rows summing to .* "
                                         r"bf16 or float16\? compute it in float32"):  # fmt: skip
        metrics.classification(scaled, HAND_LABELS)
    with pytest.raises(ValueError, match=r"rows summing to \[1\.1.*softmax\(logits\)"):
        metrics.classification(HAND_PROBS * 1.1, HAND_LABELS)
    members = np.stack([HAND_PROBS, HAND_PROBS], axis=1)
    members[2, 1] = [0.5, 0.6]  # one member of one example
    with pytest.raises(ValueError, match=r"examples \[2\] have rows summing"):
        metrics.classification(members, HAND_LABELS)
    float32 = HAND_PROBS.astype(np.float32)  # float32 softmax rounding is accepted
    assert metrics.classification(float32, HAND_LABELS)["acc"] == pytest.approx(0.75)


def test_misclassification_and_ood_scores_refuse_what_classification_refuses():
    """Labels of the wrong shape would broadcast `argmax != labels` to `[B, B]`; logits would
    give scores of the wrong sign. Both are refused by name, as in `classification`."""
    with pytest.raises(ValueError, match=r"labels must be \[B\] = \[4\]"):
        metrics.misclassification(HAND_PROBS, HAND_LABELS[:, None])
    with pytest.raises(ValueError, match=r"labels must be classes in \[0, 2\)"):
        metrics.misclassification(HAND_PROBS, np.array([0, 1, 2, 1]))
    logits = np.log(HAND_PROBS) + 1.5
    with pytest.raises(ValueError, match=r"not probabilities: .*softmax\(logits\)"):
        metrics.misclassification(logits, HAND_LABELS)
    for kind in ("msp", "entropy", "mi", "energy"):
        with pytest.raises(ValueError, match="not probabilities"):
            metrics.ood_score(logits, kind, logits=logits)


def test_misclassification_detection_matches_sklearn_with_wrong_positive():
    rng = np.random.default_rng(4)
    members = rng.dirichlet(np.ones(5) * 0.5, size=(200, 3))  # [B, M, C]
    labels = rng.integers(0, 5, 200)
    p = members.mean(1)
    wrong = (p.argmax(-1) != labels).astype(float)
    m = metrics.misclassification(members, labels)
    assert m["auroc"] == pytest.approx(roc_auc_score(wrong, -p.max(-1)), abs=1e-12)
    assert m["aupr"] == pytest.approx(average_precision_score(wrong, -p.max(-1)), abs=1e-12)
    fpr, tpr, _ = roc_curve(wrong, -p.max(-1), drop_intermediate=False)
    assert m["fpr95"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)])
    with pytest.raises(ValueError, match="right and wrong"):
        metrics.misclassification(np.eye(5)[labels], labels)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_and_aupr_match_sklearn(seed, ties):
    rng = np.random.default_rng(seed)
    id_scores, ood_scores = rng.normal(0, 1, 300), rng.normal(0.7, 1.2, 120)
    if ties:  # coarse rounding creates many ties, across and within the two sets
        id_scores, ood_scores = np.round(id_scores), np.round(ood_scores)
    y = np.r_[np.zeros(300), np.ones(120)]
    s = np.r_[id_scores, ood_scores]
    m = metrics.ood(id_scores, ood_scores)
    assert m["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert m["aupr"] == pytest.approx(average_precision_score(y, s), abs=1e-12)
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    # Default: the first ROC point reaching 95% recall (torch-uncertainty 0.13, pytorch-ood 0.4).
    assert m["fpr95"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)])
    closest = metrics.ood(id_scores, ood_scores, fpr95_convention="closest")["fpr95"]
    assert closest == pytest.approx(fpr[np.abs(tpr - 0.95) == np.abs(tpr - 0.95).min()].max())


def test_fpr95_conventions_differ_as_documented():
    id_scores = np.array([0.1, 0.2, 0.3, 0.4])
    # OOD recall is 0.94 down to the threshold 0.4 (FPR 0.25), then 1.0 at 0.3, where one ID
    # example ties with the last OOD ones (FPR 0.5).
    ood_scores = np.r_[np.full(47, 1.0), np.full(3, 0.3)]
    closest = metrics.ood(id_scores, ood_scores, fpr95_convention="closest")["fpr95"]
    assert closest == 0.25  # 0.94 is closest to 0.95
    assert metrics.ood(id_scores, ood_scores)["fpr95"] == 0.5  # the default: first >= 0.95


def test_ood_scores_hand_worked():
    members = np.array([[[0.9, 0.1], [0.7, 0.3]]])  # [1, 2, 2], mean [0.8, 0.2]
    logits = np.array([[[2.0, 0.0], [0.0, 1.0]]])  # mean logits [1.0, 0.5]
    assert metrics.ood_score(members, "msp") == pytest.approx([-0.8])
    assert metrics.ood_score(members, "entropy") == pytest.approx(
        [-(0.8 * np.log(0.8) + 0.2 * np.log(0.2))]
    )
    assert metrics.ood_score(members, "energy", logits) == pytest.approx(
        [-np.log(np.exp(1.0) + np.exp(0.5))]
    )
    assert metrics.ood_score(members, "mi")[0] > 0


probs_strategy = st.integers(2, 30).flatmap(
    lambda B: st.tuples(
        hnp.arrays(np.float64, (B, 3, 4), elements=st.floats(0.01, 1.0)),
        hnp.arrays(np.int64, (B,), elements=st.integers(0, 3)),
    )
)


@settings(max_examples=60, deadline=None)
@given(probs_strategy, st.randoms(use_true_random=False))
def test_classification_ranges_and_permutation_invariance(data, random):
    raw, labels = data
    probs = raw / raw.sum(-1, keepdims=True)
    m = metrics.classification(probs, labels)
    for key in ("acc", "ece", "aece", "mce", "disagreement"):
        assert 0.0 <= m[key] <= 1.0 + 1e-12, key
    assert 0.0 <= m["brier"] <= 2.0
    assert m["nll"] >= 0 and m["mutual_information"] >= 0 and m["pairwise_kl"] >= -1e-12
    order = list(range(len(labels)))
    random.shuffle(order)
    permuted = metrics.classification(probs[order], labels[order])
    # Equal-mass bins of tied confidences may regroup under a permutation; all else is exact.
    for key in m.keys() - {"aece"}:
        assert permuted[key] == pytest.approx(m[key], abs=1e-12), key


scores = hnp.arrays(
    np.float64, st.integers(2, 40), elements=st.floats(-3, 3).map(lambda x: round(x, 1))
)


@settings(max_examples=80, deadline=None)
@given(scores, scores, st.randoms(use_true_random=False))
def test_ood_properties(id_scores, ood_scores, random):
    m = metrics.ood(id_scores, ood_scores)
    assert all(0.0 <= v <= 1.0 for v in m.values())
    swapped = metrics.ood(ood_scores, id_scores)
    assert swapped["auroc"] == pytest.approx(1.0 - m["auroc"], abs=1e-12)
    shuffled_id = list(id_scores)
    random.shuffle(shuffled_id)
    assert metrics.ood(np.array(shuffled_id), ood_scores) == pytest.approx(m, abs=1e-12)


def _mean_auroc(id_s, ood_s, i, js):
    """sklearn's AUROC of resampled ID scores `id_s[i]` against each OOD set's `s[j]`, averaged."""
    return np.mean(
        [
            roc_auc_score(np.r_[np.zeros(len(i)), np.ones(len(j))], np.r_[id_s[i], s[j]])
            for s, j in zip(ood_s, js, strict=True)
        ]
    )


def _bootstrap_reference(id_a, ood_a, id_b, ood_b, resamples, seed):
    """The paired bootstrap written out with sklearn's AUROC, replaying the documented draws."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        i = rng.integers(0, len(id_a), len(id_a))
        js = [rng.integers(0, len(s), len(s)) for s in ood_a]
        draws.append(_mean_auroc(id_a, ood_a, i, js) - _mean_auroc(id_b, ood_b, i, js))
    return draws


def test_auroc_difference_matches_a_sklearn_bootstrap():
    rng = np.random.default_rng(3)
    id_a, id_b = rng.normal(0, 1, 40), rng.normal(0, 1, 40)
    ood_a = [rng.normal(0.8, 1, 30), rng.normal(0.3, 1, 25)]
    ood_b = [rng.normal(0.5, 1, 30), rng.normal(0.2, 1, 25).round(1)]  # ties too
    result = metrics.auroc_difference(id_a, ood_a, id_b, ood_b, resamples=200, seed=5)
    draws = _bootstrap_reference(id_a, ood_a, id_b, ood_b, 200, 5)
    low, high = np.percentile(draws, [2.5, 97.5])
    assert result["low"] == pytest.approx(low, abs=1e-12)
    assert result["high"] == pytest.approx(high, abs=1e-12)

    def auroc(id_s, s):
        return roc_auc_score(np.r_[np.zeros(len(id_s)), np.ones(len(s))], np.r_[id_s, s])

    full = np.mean([auroc(id_a, s) for s in ood_a]) - np.mean([auroc(id_b, s) for s in ood_b])
    assert result["difference"] == pytest.approx(full, abs=1e-12)
    assert result["low"] < result["difference"] < result["high"]


def test_auroc_difference_of_a_method_with_itself_is_exactly_zero():
    rng = np.random.default_rng(0)
    id_s, ood_s = rng.random(20), [rng.random(10) + 0.3]
    result = metrics.auroc_difference(id_s, ood_s, id_s, ood_s, resamples=50)
    assert result == {"difference": 0.0, "low": 0.0, "high": 0.0}


def test_auroc_difference_refuses_unpaired_scores():
    s = np.arange(10.0)
    with pytest.raises(ValueError, match="OOD set 0: 10 scores for method a but 9"):
        metrics.auroc_difference(s, [s], s, [s[:9]])
    with pytest.raises(ValueError, match="method a has 1 OOD sets and method b 2"):
        metrics.auroc_difference(s, [s], s, [s, s])


def test_pooled_auroc_difference_averages_runs_and_redraws_each():
    rng = np.random.default_rng(4)
    runs = []
    for n in (40, 30):  # two seeds, different test sizes
        ood_a = [rng.normal(0.8, 1, 20), rng.normal(0.3, 1, 15)]
        ood_b = [rng.normal(0.5, 1, 20), rng.normal(0.2, 1, 15)]
        runs.append((rng.normal(0, 1, n), ood_a, rng.normal(0, 1, n), ood_b))
    result = metrics.pooled_auroc_difference(runs, resamples=100, seed=2)
    singles = [metrics.auroc_difference(*run, resamples=1)["difference"] for run in runs]
    assert result["difference"] == pytest.approx(np.mean(singles), abs=1e-12)
    # The reference: one generator, per resample every run's ID then OOD draws, in run order.
    draw_rng = np.random.default_rng(2)
    draws = []
    for _ in range(100):
        per_run = []
        for id_a, ood_a, id_b, ood_b in runs:
            i = draw_rng.integers(0, len(id_a), len(id_a))
            js = [draw_rng.integers(0, len(s), len(s)) for s in ood_a]
            per_run.append(_mean_auroc(id_a, ood_a, i, js) - _mean_auroc(id_b, ood_b, i, js))
        draws.append(np.mean(per_run))
    low, high = np.percentile(draws, [2.5, 97.5])
    assert (result["low"], result["high"]) == pytest.approx((low, high), abs=1e-12)
    with pytest.raises(ValueError, match="run 1: OOD set 0: 20 scores for method a but 19"):
        metrics.pooled_auroc_difference(
            [runs[0], (*runs[1][:3], [runs[1][3][0][:19], runs[1][3][1]])]
        )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: metrics.calibration([0.9, 0.8, 0.7], [1, 0]), r"3 confidences but 2"),
        (lambda: metrics.reliability([0.9, 0.8, 0.7], [1, 0]), r"3 confidences but 2"),
        (lambda: metrics.calibration([1.5, 0.8], [1, 0]), r"confidences must lie in \[0, 1\]"),
        (lambda: metrics.calibration([np.nan, 0.8], [1, 0]), "NaN/inf"),
        (lambda: metrics.calibration([0.9, 0.8], [1, 2]), r"correct must be 0/1"),
        (lambda: metrics.calibration([], []), "empty"),
        (lambda: metrics.calibration([[0.9, 0.8]], [[1, 0]]), r"1-D"),
        (lambda: metrics.calibration([0.9, 0.8], [1, 0], num_bins=0), "num_bins"),
        (lambda: metrics.classification(HAND_PROBS, HAND_LABELS, num_bins=0), "num_bins"),
        (lambda: metrics.diversity(np.log(np.stack([HAND_PROBS] * 2, 1))), "not probabilities"),
        (lambda: metrics.ood(np.ones((3, 2)), np.arange(4.0)), r"id_scores must be 1-D"),
        (lambda: _difference(resamples=0), "resamples"),
        (lambda: _difference(level=95), r"level must be in \(0, 1\)"),
    ],
)
def test_calibration_diversity_ood_and_bootstrap_refuse_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _difference(**kwargs):
    scores = [np.arange(5.0), [np.arange(3.0)]]
    return metrics.auroc_difference(*scores, *scores, **kwargs)
