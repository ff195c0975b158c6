"""Test accuracy and NLL of each published member of a trained study's workdir.

    python scripts/member_accuracy.py runs/vit_fmnist [--members 0,1,2] [--batch 256]

Loads `WORKDIR/hf/member_M` the way every study does (`engine.published`), predicts the full
test split of the workdir's config and prints one line per member. The per-seed ViT
accuracies come from this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hydra_jax import metrics
from hydra_jax.ensembles import baselines as methods
from hydra_jax.evaluation import Method, predict, softmax
from hydra_jax.experiments import engine


def member_indices(text: str) -> list[int]:
    """`--members`: comma-separated non-negative integers, e.g. `0,1,2`."""
    try:
        indices = [int(i) for i in text.split(",")]
    except ValueError:
        message = f"--members wants integers like 0,1,2, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if any(i < 0 for i in indices):
        raise argparse.ArgumentTypeError(f"--members wants non-negative indices, got {text!r}")
    return indices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--members", type=member_indices, default=[0, 1, 2],
                        help="comma-separated member indices")  # fmt: skip
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    models, data, _ = engine.published(args.workdir, args.members)
    study = data.study
    labels = np.asarray(study.test.labels)
    for m, model in zip(args.members, models, strict=True):
        method = Method(f"member_{m}", methods.single(model), model.params)
        logits = predict(method, study.test, args.batch, progress=False)[:, 0]  # [N, C]
        result = metrics.classification(softmax(logits), labels)  # as the studies do
        print(f"member {m}: test accuracy {100 * result['acc']:.2f}%, NLL {result['nll']:.4f} "
              f"({len(labels)} examples)")  # fmt: skip


if __name__ == "__main__":
    main()
