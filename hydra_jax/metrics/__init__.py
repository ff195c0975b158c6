"""Uncertainty metrics as pure numpy functions (float64): `core` (classification, calibration,
OOD detection by output scores, paired bootstrap intervals), `temperature` (temperature
scaling), `selective` (risk-coverage: AURC, AUGRC), `conformal` (LAC, APS, RAPS sets) and
`detectors` (feature-space OOD detectors). Every name of `core` is also here.
"""

from hydra_jax.metrics import conformal, detectors, selective, temperature
from hydra_jax.metrics.core import (
    OodScore,
    auroc_difference,
    calibration,
    check_labels,
    classification,
    classwise_ece,
    diversity,
    misclassification,
    ood,
    ood_curves,
    ood_score,
    pooled_auroc_difference,
    reliability,
)

__all__ = [
    "OodScore",
    "auroc_difference",
    "calibration",
    "check_labels",
    "classification",
    "classwise_ece",
    "conformal",
    "detectors",
    "diversity",
    "misclassification",
    "ood",
    "ood_curves",
    "ood_score",
    "pooled_auroc_difference",
    "reliability",
    "selective",
    "temperature",
]
