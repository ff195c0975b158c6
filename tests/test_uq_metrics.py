"""Temperature scaling, selective prediction, conformal sets, classwise ECE, max-logit and the
feature-space detectors against independent float64 references: direct formulas, brute force,
scikit-learn and published closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from scipy.special import logsumexp
from sklearn.covariance import EmpiricalCovariance, LedoitWolf
from sklearn.metrics import average_precision_score
from sklearn.neighbors import NearestNeighbors

from hydra_jax import metrics
from hydra_jax.metrics import conformal, detectors, selective, temperature


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _classified(rng: np.random.Generator, n: int, c: int, m: int = 1, scale: float = 3.0):
    """Member logits `[n, m, c]` and labels drawn from a sharper softmax of the member mean."""
    logits = rng.normal(size=(n, 1, c)) * scale + rng.normal(size=(n, m, c))
    truth = _softmax(logits.mean(1) / 1.7)
    labels = np.array([rng.choice(c, p=p) for p in truth])
    return logits, labels


def test_classwise_ece_is_the_per_class_binned_gap():
    rng = np.random.default_rng(0)
    logits, labels = _classified(rng, 300, 4, m=2)
    probs = _softmax(logits)
    p = probs.mean(1)
    expected = 0.0
    for c in range(4):  # one class at a time, bins by hand
        for b in range(10):
            low, high = b / 10, (b + 1) / 10
            inside = (p[:, c] >= low) & ((p[:, c] < high) if b < 9 else (p[:, c] <= high))
            if inside.any():
                gap = abs((labels[inside] == c).mean() - p[inside, c].mean())
                expected += inside.sum() / 300 * gap
    assert metrics.classwise_ece(probs, labels, 10) == pytest.approx(expected / 4, abs=1e-12)
    assert metrics.classification(probs, labels, 10)["cwece"] == pytest.approx(expected / 4)


def test_max_logit_is_the_negated_top_mean_logit():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(7, 3, 5))
    score = metrics.ood_score(_softmax(logits), "max_logit", logits)
    np.testing.assert_allclose(score, -logits.mean(1).max(-1), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="needs logits"):
        metrics.ood_score(_softmax(logits), "max_logit")


@pytest.mark.parametrize("members", [1, 3])
def test_temperature_reaches_the_nll_minimum_of_a_fine_grid(members):
    rng = np.random.default_rng(members)
    logits, labels = _classified(rng, 400, 5, members)
    t = temperature.fit(logits, labels)
    grid = np.geomspace(0.05, 20, 20001)
    losses = []
    for g in grid:  # the ensemble's NLL at T, written out
        p = np.mean([_softmax(logits[:, m] / g) for m in range(members)], 0)
        losses.append(-np.log(p[np.arange(400), labels]).mean())
    best = float(np.min(losses))
    assert temperature.nll(logits, labels, t) <= best + 1e-9
    assert t == pytest.approx(grid[int(np.argmin(losses))], rel=1e-3)
    assert t > 1  # the labels were drawn from a softer softmax: scaling softens
    np.testing.assert_allclose(temperature.scaled(logits, 1.0), _softmax(logits), atol=1e-12)


def test_temperature_refuses_bad_input():
    with pytest.raises(ValueError, match="positive"):
        temperature.scaled(np.zeros((2, 3)), 0.0)
    with pytest.raises(ValueError, match="labels must be classes"):
        temperature.fit(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="NaN"):
        temperature.fit(np.full((2, 3), np.nan), np.array([0, 1]))


def _brute_force_curve(confidence: np.ndarray, correct: np.ndarray):
    order = np.argsort(-confidence)
    errors = 1 - correct[order]
    n = len(errors)
    risk = [errors[:k].sum() / k for k in range(1, n + 1)]
    generalised = [errors[:k].sum() / n for k in range(0, n + 1)]
    return np.array(risk), np.array(generalised)


def test_selective_metrics_equal_brute_force_and_the_augrc_closed_form():
    rng = np.random.default_rng(2)
    confidence = rng.uniform(size=500)  # no ties
    correct = (rng.uniform(size=500) < confidence).astype(float)
    got = selective.selective(confidence, correct)
    risk, generalised = _brute_force_curve(confidence, correct)
    assert got["aurc"] == pytest.approx(risk.mean(), abs=1e-12)  # Geifman et al.: 1/N sum_k
    assert got["augrc"] == pytest.approx(
        np.sum((generalised[1:] + generalised[:-1]) / 2) / 500, abs=1e-12
    )
    for c in (80, 90, 95):
        assert got[f"risk_{c}"] == pytest.approx(risk[math.ceil(c / 100 * 500) - 1])
    # Traub et al. 2024, eq. for AUGRC from failure-detection AUROC and accuracy.
    wrong = correct == 0
    auroc_f = metrics.ood(-confidence[~wrong], -confidence[wrong])["auroc"]
    acc = correct.mean()
    closed = (1 - auroc_f) * acc * (1 - acc) + (1 - acc) ** 2 / 2
    assert got["augrc"] == pytest.approx(closed, abs=1e-12)


def test_torch_uncertaintys_areas_match_a_hand_computed_case():
    """torch-uncertainty 0.13's AURC / AUGRC on 4 examples, by hand: accepted in decreasing
    confidence 0.9 (right), 0.7 (wrong), 0.5 (right), 0.2 (wrong); risks 0, 1/2, 1/3, 1/2 at
    coverages 1/4 .. 1; trapezoids of width 1/4, over 1 - 1/4."""
    got = selective.torch_uncertainty_areas(np.array([0.5, 0.9, 0.2, 0.7]),
                                            np.array([1, 1, 0, 0]))  # fmt: skip
    risk = np.array([0, 1 / 2, 1 / 3, 1 / 2])
    aurc = 0.25 * ((0 + 1 / 2) + (1 / 2 + 1 / 3) + (1 / 3 + 1 / 2)) / 2 / 0.75
    assert got["aurc_tu"] == pytest.approx(aurc, abs=1e-15)
    generalised = risk * np.array([1, 2, 3, 4]) / 4  # errors so far over N: 0, 1/4, 1/4, 2/4
    augrc = 0.25 * np.sum(generalised[1:] + generalised[:-1]) / 2 / 0.75
    assert got["augrc_tu"] == pytest.approx(augrc, abs=1e-15)
    assert set(got) <= set(selective.selective(np.array([0.5, 0.9]), np.array([1, 0])))


def test_selective_groups_ties_and_matches_a_hand_computed_case():
    # confidences 0.9, 0.9, 0.5, 0.2; correct 1, 0, 1, 0: points at coverage 0.5, 0.75, 1
    got = selective.selective(np.array([0.9, 0.5, 0.9, 0.2]), np.array([1, 1, 0, 0]), (0.6,))
    # risks 1/2, 1/3, 2/4; AURC = 0.5 * 1/2 + 0.25 * 1/3 + 0.25 * 1/2
    assert got["aurc"] == pytest.approx(0.25 + 1 / 12 + 0.125)
    # generalised 1/4, 1/4, 2/4 from 0: trapezoids 0.5*(0+.25)/2 + .25*.25 + .25*(.25+.5)/2
    assert got["augrc"] == pytest.approx(0.0625 + 0.0625 + 0.09375)
    assert got["risk_60"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="coverages"):
        selective.selective(np.array([0.5, 0.6]), np.array([1, 0]), (0.0,))


def test_conformal_scores_match_their_definitions():
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    np.testing.assert_allclose(conformal.nonconformity(p, "lac"), 1 - p)
    aps = np.array([[0.5, 0.8, 1.0], [1.0, 0.6, 0.9]])
    np.testing.assert_allclose(conformal.nonconformity(p, "aps"), aps)
    raps = aps + 0.1 * np.maximum(np.array([[1, 2, 3], [3, 1, 2]]) - 1, 0)
    np.testing.assert_allclose(conformal.nonconformity(p, "raps", 0.1, 1), raps)
    # n = 9, alpha = 0.2: the ceil(10 * 0.8) = 8th smallest calibration score
    scores = np.arange(9.0)[:, None] * np.ones((1, 2))
    assert conformal.threshold(scores, np.zeros(9, int), 0.2) == 7.0
    assert conformal.threshold(scores, np.zeros(9, int), 0.05) == math.inf
    with pytest.raises(ValueError, match="alpha"):
        conformal.threshold(scores, np.zeros(9, int), 1.0)
    with pytest.raises(ValueError, match="unknown conformal"):
        conformal.nonconformity(p, "thr")


def test_aps_gives_the_last_ranked_class_a_mass_of_exactly_one():
    """float32 softmax rows sum to 1 +- 1e-7: a threshold of 1 (a classifier wrong more often
    than alpha) must take every class, not those whose rounding fell below 1."""
    rng = np.random.default_rng(9)
    probs = _softmax(rng.normal(size=(500, 2)) * 0.3).astype(np.float32)
    labels = rng.integers(0, 2, 500)  # 50% accuracy: the threshold is the full mass
    scores = conformal.nonconformity(probs, "aps")
    assert np.all(scores.max(-1) == 1.0)
    out = conformal.conformal(probs, labels, {"test": (probs, labels)}, "aps", 0.1)
    assert out["threshold"] == 1.0
    assert out["test"] == {"coverage": 1.0, "size": 2.0}


@pytest.mark.parametrize("method", conformal.METHODS)
def test_conformal_coverage_keeps_its_finite_sample_guarantee(method):
    """Exchangeable calibration and test data: over many random splits the mean coverage lies
    in [1 - alpha, 1 - alpha + 1 / (n + 1)] (within the Monte Carlo error)."""
    rng = np.random.default_rng(3)
    alpha, n, trials = 0.1, 99, 300
    coverages, sizes = [], []
    for _ in range(trials):
        logits, labels = _classified(rng, n + 200, 6, scale=1.5)
        probs = _softmax(logits[:, 0])
        out = conformal.conformal(
            probs[:n], labels[:n], {"test": (probs[n:], labels[n:])}, method, alpha
        )
        coverages.append(out["test"]["coverage"])
        sizes.append(out["test"]["size"])
    mean, error = np.mean(coverages), 3 * np.std(coverages) / np.sqrt(trials)
    assert 1 - alpha - error <= mean <= 1 - alpha + 1 / (n + 1) + error
    assert 1 <= np.mean(sizes) < 6  # informative sets


def test_mahalanobis_and_relative_mahalanobis_equal_scikit_learn():
    rng = np.random.default_rng(4)
    train = rng.normal(size=(300, 5)) + np.repeat(np.eye(3, 5) * 4, 100, 0)
    labels = np.repeat(np.arange(3), 100)
    test = rng.normal(size=(20, 5)) * 2
    stats = detectors.fit("mahalanobis", train, labels, np.zeros((300, 3)), 3)
    centred = train - np.stack([train[labels == c].mean(0) for c in range(3)])[labels]
    shared = EmpiricalCovariance(assume_centered=True).fit(centred)
    per_class = [
        shared.mahalanobis(test - train[labels == c].mean(0)) for c in range(3)
    ]  # squared distances
    expected = np.min(per_class, 0)
    np.testing.assert_allclose(
        detectors.score("mahalanobis", stats, test, None), expected, rtol=1e-9
    )
    relative = detectors.fit("relative_mahalanobis", train, labels, np.zeros((300, 3)), 3)
    background = EmpiricalCovariance().fit(train).mahalanobis(test)
    np.testing.assert_allclose(
        detectors.score("relative_mahalanobis", relative, test, None),
        np.min(np.array(per_class) - background, 0),
        rtol=1e-9,
    )
    # Classes without training examples (a zero-shot study's held out) have no mean.
    seen = detectors.fit("mahalanobis", train[:200], labels[:200], np.zeros((200, 3)), 3)
    assert seen["means"].shape == (2, 5)


def test_ledoit_wolf_mahalanobis_equals_scikit_learn():
    """Near-singular features (variances from 1e-8 to 1): the shrunk shared and background
    covariances are scikit-learn's `LedoitWolf` on the centred features."""
    rng = np.random.default_rng(13)
    scales = np.logspace(-4, 0, 6)
    labels = np.repeat(np.arange(3), 60)
    train = rng.normal(size=(180, 6)) * scales + np.repeat(np.eye(3, 6), 60, 0)
    test = rng.normal(size=(15, 6)) * scales * 3
    means = np.stack([train[labels == c].mean(0) for c in range(3)])
    shared = LedoitWolf(assume_centered=True).fit(train - means[labels])
    background = LedoitWolf(assume_centered=True).fit(train - train.mean(0))
    to_classes = np.array([shared.mahalanobis(test - m) for m in means])  # [3, N] squared
    stats = detectors.fit("mahalanobis", train, labels, np.zeros((180, 3)), 3,
                          covariance="ledoit_wolf")  # fmt: skip
    np.testing.assert_allclose(
        detectors.score("mahalanobis", stats, test, None), to_classes.min(0), rtol=1e-8
    )
    relative = detectors.fit("relative_mahalanobis", train, labels, np.zeros((180, 3)), 3,
                             covariance="ledoit_wolf")  # fmt: skip
    expected = (to_classes - background.mahalanobis(test - train.mean(0))).min(0)
    np.testing.assert_allclose(
        detectors.score("relative_mahalanobis", relative, test, None), expected, rtol=1e-8
    )
    with pytest.raises(ValueError, match="covariance: 'oas'"):
        detectors.fit("mahalanobis", train, labels, np.zeros((180, 3)), 3, covariance="oas")


def test_knn_is_the_kth_cosine_neighbour_distance():
    rng = np.random.default_rng(5)
    train, test = rng.normal(size=(200, 8)), rng.normal(size=(30, 8))
    stats = detectors.fit("knn", train, np.zeros(200, int), np.zeros((200, 1)), 1, k=7)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    neighbours = NearestNeighbors(n_neighbors=7).fit(unit(train))
    expected = neighbours.kneighbors(unit(test))[0][:, -1]
    np.testing.assert_allclose(detectors.score("knn", stats, test, None), expected, rtol=1e-9)
    with pytest.raises(detectors.CannotFitError, match="exceeds"):
        detectors.fit("knn", train, np.zeros(200, int), np.zeros((200, 1)), 1, k=201)


def test_vim_follows_the_published_recipe_with_the_true_classifier():
    """Features and logits of a known linear classifier: ViM computed from the true W and b by
    the steps of Wang et al. 2022 (their released code's order) equals ours, which recovers W
    and b by least squares."""
    rng = np.random.default_rng(6)
    D, C, dim = 12, 4, 5
    W, b = rng.normal(size=(C, D)), rng.normal(size=C)  # logits = W x + b, as torch's Linear
    train = rng.normal(size=(400, D)) @ rng.normal(size=(D, D))
    test = rng.normal(size=(25, D)) * 3
    train_logits, test_logits = train @ W.T + b, test @ W.T + b
    u = -np.linalg.pinv(W) @ b
    covariance = EmpiricalCovariance(assume_centered=True).fit(train - u).covariance_
    values, vectors = np.linalg.eig(covariance)
    NS = np.ascontiguousarray((vectors.T[np.argsort(values * -1)[dim:]]).T)
    alpha = train_logits.max(-1).mean() / np.linalg.norm((train - u) @ NS, axis=-1).mean()
    energy = np.log(np.exp(test_logits).sum(-1))
    expected = alpha * np.linalg.norm((test - u) @ NS, axis=-1) - energy
    stats = detectors.fit("vim", train, np.zeros(400, int), train_logits, 1, vim_dim=dim)
    np.testing.assert_allclose(
        detectors.score("vim", stats, test, test_logits), expected, rtol=1e-7
    )
    with pytest.raises(ValueError, match="not an affine function"):
        detectors.fit("vim", train, np.zeros(400, int), np.tanh(train_logits), 1)
    with pytest.raises(detectors.CannotFitError, match="more examples"):
        detectors.fit("vim", train[:10], np.zeros(10, int), train_logits[:10], 1)


def test_member_scores_fit_each_member_on_its_own_features():
    rng = np.random.default_rng(7)
    train = rng.normal(size=(100, 2, 4))
    labels = rng.integers(0, 2, 100)
    test = rng.normal(size=(9, 2, 4))
    logits = np.zeros((100, 2, 2))
    out = detectors.member_scores(
        "mahalanobis", (train, labels, logits), {"t": (test, np.zeros((9, 2, 2)))}, 2
    )
    for m in range(2):
        stats = detectors.fit("mahalanobis", train[:, m], labels, logits[:, m], 2)
        np.testing.assert_allclose(
            out["t"][:, m], detectors.score("mahalanobis", stats, test[:, m], None), rtol=1e-12
        )


def test_react_is_the_energy_of_the_clipped_features_through_the_true_classifier():
    """Sun et al. 2021 with the true W and b: clip every feature value at the 90th percentile
    of the training features' values, recompute the logits, take -logsumexp."""
    rng = np.random.default_rng(9)
    D, C = 10, 4
    W, b = rng.normal(size=(D, C)), rng.normal(size=C)
    train = np.abs(rng.normal(size=(300, D)))  # post-ReLU-like activations
    test = np.abs(rng.normal(size=(40, D))) * 2
    clip = np.percentile(train.ravel(), 90)
    expected = -logsumexp(np.minimum(test, clip) @ W + b, axis=-1)
    stats = detectors.fit("react", train, np.zeros(300, int), train @ W + b, C)
    assert stats["clip"] == pytest.approx(clip, rel=1e-12)
    np.testing.assert_allclose(detectors.score("react", stats, test, None), expected, rtol=1e-9)


def test_kl_matching_is_the_divergence_from_the_nearest_class_template():
    """Hendrycks et al. 2022: templates are the mean training softmax of the examples predicted
    as each class (none for a class no example is predicted as); a test example's score is
    scipy's KL divergence of its softmax from the nearest template."""
    rng = np.random.default_rng(10)
    C = 4
    train_logits = rng.normal(size=(200, C)) * 2
    train_logits[:, 3] -= 50  # no training example predicted as class 3
    test_logits = rng.normal(size=(30, C)) * 2
    test_logits[:3, 3] += 60  # predicted as class 3
    p_train, p_test = _softmax(train_logits), _softmax(test_logits)
    predicted = p_train.argmax(-1)
    templates = [p_train[predicted == c].mean(0) for c in np.unique(predicted)]
    expected = [min(scipy_stats.entropy(p, t) for t in templates) for p in p_test]
    stats = detectors.fit("kl_matching", np.zeros((200, 2)), np.zeros(200, int), train_logits, C)
    scores = detectors.score("kl_matching", stats, np.zeros((30, 2)), test_logits)
    np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-12)


def test_gen_is_the_generalised_entropy_of_the_top_classes():
    """Liu et al. 2023: sum over the 100 most probable classes of p^0.1 (1 - p)^0.1, on the
    member-mean probabilities; by hand on two classes."""
    p = np.array([[[0.9, 0.1]], [[0.5, 0.5]]])
    by_hand = [2 * (0.9**0.1 * 0.1**0.1), 2 * 0.5**0.2]
    np.testing.assert_allclose(metrics.ood_score(p, "gen"), by_hand, rtol=1e-12)
    rng = np.random.default_rng(11)
    members = _softmax(rng.normal(size=(20, 3, 150)) * 3)
    mean = members.mean(1)
    expected = [sum(q**0.1 * (1 - q) ** 0.1 for q in sorted(row, reverse=True)[:100])
                for row in mean]  # fmt: skip
    np.testing.assert_allclose(metrics.ood_score(members, "gen"), expected, rtol=1e-10)


def test_aupr_in_is_average_precision_with_id_positive():
    rng = np.random.default_rng(12)
    id_scores = rng.normal(size=300).round(1)  # ties
    ood_scores = rng.normal(size=200).round(1) + 0.7
    y_in = np.r_[np.ones(300), np.zeros(200)]
    expected = average_precision_score(y_in, -np.r_[id_scores, ood_scores])
    assert metrics.ood(id_scores, ood_scores)["aupr_in"] == pytest.approx(expected, abs=1e-12)


def test_kept_fits_are_keyed_by_what_they_were_fitted_on():
    """`member_scores(..., fitted=...)` reuses a fit only for the same training data and
    settings: other features (even in a reused array) fit anew."""
    rng = np.random.default_rng(14)
    train = rng.normal(size=(60, 2, 4))
    labels = rng.integers(0, 2, 60)
    logits = np.zeros((60, 2, 2))
    sets = {"t": (rng.normal(size=(7, 2, 4)), np.zeros((7, 2, 2)))}
    fitted: dict = {}
    first = detectors.member_scores("mahalanobis", (train, labels, logits), sets, 2, fitted=fitted)
    again = detectors.member_scores("mahalanobis", (train, labels, logits), sets, 2, fitted=fitted)
    assert len(fitted) == 2  # one per member
    np.testing.assert_array_equal(first["t"], again["t"])
    train[:, 0] += 1.0  # the same array, other contents
    moved = detectors.member_scores("mahalanobis", (train, labels, logits), sets, 2, fitted=fitted)
    plain = detectors.member_scores("mahalanobis", (train, labels, logits), sets, 2)
    np.testing.assert_array_equal(moved["t"], plain["t"])
    assert len(fitted) == 3 and not np.array_equal(moved["t"][:, 0], first["t"][:, 0])


def test_a_kept_temperature_is_the_one_its_validation_data_give():
    """Calibration fits its temperature once per validation data (a bootstrap redraws only the
    test sets) and anew where they change; each result is a fresh evaluator's."""
    from hydra_jax.experiments.evaluators import Calibration
    from hydra_jax.experiments.evaluators.base import Outputs, Predictions

    rng = np.random.default_rng(15)

    def outputs(n: int) -> Outputs:
        logits = rng.normal(size=(n, 2, 3)) * 3
        return Outputs(logits, _softmax(logits), rng.integers(0, 3, n))

    validation = outputs(40)
    kept = Calibration()
    for _ in range(3):
        predictions = Predictions(outputs(30), validation=validation)
        assert kept(predictions, None) == Calibration()(predictions, None)
    assert len(kept.fitted) == 1
    assert kept(predictions, None)["temperature"] == temperature.fit(
        validation.logits, validation.labels
    )
    other = Predictions(outputs(30), validation=outputs(40))
    assert kept(other, None) == Calibration()(other, None) and len(kept.fitted) == 2


@pytest.mark.parametrize("detector", detectors.DETECTORS)
def test_every_detector_scores_far_away_features_as_ood(detector):
    """The sign convention (higher = more OOD) on features a linear classifier separates: OOD
    features with no class's signal (around the origin, 6 from every class centre) score
    higher than ID test features."""
    rng = np.random.default_rng(8)
    centres = np.eye(3, 16) * 6
    labels = rng.integers(0, 3, 600)
    train = centres[labels] + rng.normal(size=(600, 16))
    test = centres[labels[:100]] + rng.normal(size=(100, 16))
    ood = rng.normal(size=(100, 16))
    W, b = centres.T, np.zeros(3)
    stats = detectors.fit(detector, train, labels, train @ W + b, 3, k=10, vim_dim=4)
    id_scores = detectors.score(detector, stats, test, test @ W + b)
    ood_scores = detectors.score(detector, stats, ood, ood @ W + b)
    assert metrics.ood(id_scores, ood_scores)["auroc"] > 0.9

    # Scored in blocks of ROWS examples (memory bounded), the scores are the same.
    whole = detectors.score(detector, stats, ood, ood @ W + b)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(detectors, "ROWS", 7)
        blocks = detectors.score(detector, stats, ood, ood @ W + b)
    np.testing.assert_allclose(blocks, whole, rtol=1e-12, atol=1e-12)
