"""Evaluation: the prediction loop, metrics per method, costs, results.json, report.md, plots."""

from hydra_jax.evaluation import report, seeds
from hydra_jax.evaluation.predict import (
    Method,
    cost,
    logits_forward,
    model_method,
    predict,
    save_predictions,
    softmax,
    write_results,
    xla_flops,
)

__all__ = [
    "Method",
    "cost",
    "logits_forward",
    "model_method",
    "predict",
    "report",
    "save_predictions",
    "seeds",
    "softmax",
    "write_results",
    "xla_flops",
]
