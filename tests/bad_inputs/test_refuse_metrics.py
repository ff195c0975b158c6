"""Metrics refuse logits for probabilities, bad labels and degenerate sets."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hydra_jax import metrics

CASES = [
    pytest.param(
        lambda c: metrics.classification(np.log(c.probs) + 2, c.labels),
        ValueError,
        "softmax(logits)",
        id="logits as probs",
    ),
    pytest.param(
        lambda c: metrics.classification(c.probs * 1.1, c.labels),
        ValueError,
        "rows summing",
        id="rows not summing to 1",
    ),
    pytest.param(
        lambda c: metrics.classification(c.probs, c.labels + 1),
        ValueError,
        "labels must be classes in [0, 2)",
        id="label out of range",
    ),
    pytest.param(
        lambda c: metrics.classification(c.probs, c.labels + 0.0),
        ValueError,
        "integer classes",
        id="float labels",
    ),
    pytest.param(
        lambda c: metrics.classification(c.probs, c.labels[:2]),
        ValueError,
        "labels must be [B]",
        id="labels of another length",
    ),
    pytest.param(
        lambda c: metrics.classification(c.probs * np.nan, c.labels),
        ValueError,
        "NaN/inf",
        id="NaN probabilities",
    ),
    pytest.param(
        lambda c: metrics.classification(np.zeros((0, 2)), c.labels[:0]),
        ValueError,
        "empty",
        id="empty probabilities",
    ),
    pytest.param(
        lambda c: metrics.ood(np.arange(5.0), np.array([1.0])),
        ValueError,
        "at least 2",
        id="OOD set of one",
    ),
    pytest.param(
        lambda c: metrics.ood(np.arange(5.0), np.array([1.0, np.nan])),
        ValueError,
        "NaN/inf",
        id="NaN OOD scores",
    ),
    pytest.param(
        lambda c: metrics.ood_score(c.probs, "magic"),
        ValueError,
        "unknown OOD score",
        id="unknown OOD score",
    ),
    pytest.param(
        lambda c: metrics.ood_score(np.log(c.probs) + 1.5, "entropy"),
        ValueError,
        "not probabilities",
        id="logits as OOD-score probabilities",
    ),
    pytest.param(
        lambda c: metrics.calibration(c.probs.max(-1), c.labels[:2] == 1),
        ValueError,
        "3 confidences but 2",
        id="confidences and correct flags of different lengths",
    ),
    pytest.param(
        lambda c: metrics.calibration(100 * c.probs.max(-1), c.labels == 1),
        ValueError,
        "confidences must lie in [0, 1]",
        id="a percentage as a confidence",
    ),
    pytest.param(
        lambda c: metrics.diversity(np.log(np.stack([c.probs, c.probs], 1))),
        ValueError,
        "not probabilities",
        id="member logits as diversity probabilities",
    ),
    pytest.param(
        lambda c: metrics.ood(np.ones((5, 2)), np.arange(3.0)),
        ValueError,
        "id_scores must be 1-D",
        id="per-member OOD scores [N, M]",
    ),
    pytest.param(
        lambda c: metrics.auroc_difference(
            np.arange(5.0), [np.arange(3.0)], np.arange(5.0), [np.arange(3.0)], level=95
        ),
        ValueError,
        "level must be in (0, 1)",
        id="a bootstrap level in percent",
    ),
    pytest.param(
        lambda c: metrics.misclassification(c.probs, c.labels[:, None]),
        ValueError,
        "labels must be [B]",
        id="column-vector labels for misclassification",
    ),
    pytest.param(
        lambda c: metrics.ood(np.arange(5.0), np.arange(3.0), fpr95_convention="x"),
        ValueError,
        "fpr95_convention",
        id="unknown FPR95 rule",
    ),
]


@pytest.mark.parametrize(("call", "error", "fragment"), CASES)
def test_refused(call, error, fragment, c):
    with pytest.raises(error, match=re.escape(fragment)):
        call(c)
