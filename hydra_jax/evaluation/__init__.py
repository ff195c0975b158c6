"""Evaluation: the prediction loop, metrics per method, costs, results.json, report.md, plots."""

from hydra_jax.evaluation import report, seeds
from hydra_jax.evaluation.predict import (
    OOD_SCORES,
    Method,
    cost,
    logits_forward,
    method_metrics,
    ood_metrics,
    predict,
    save_predictions,
    softmax,
    write_results,
    xla_flops,
)

__all__ = [
    "OOD_SCORES",
    "Method",
    "cost",
    "logits_forward",
    "method_metrics",
    "ood_metrics",
    "predict",
    "report",
    "save_predictions",
    "seeds",
    "softmax",
    "write_results",
    "xla_flops",
]
