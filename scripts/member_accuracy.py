"""Test accuracy and NLL of each published member of a trained baselines workdir.

    python scripts/member_accuracy.py runs/vit_fmnist [--members 0,1,2] [--batch 256]

Loads `WORKDIR/hf/member_M` the way every study does (`baselines.trained`), predicts the full
test split of the workdir's config and prints one line per member. The README's per-seed ViT
accuracies come from this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.special import log_softmax

from hydra_jax.ensembles import baselines as methods
from hydra_jax.evaluation import Method, predict
from hydra_jax.experiments import baselines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--members", default="0,1,2", help="comma-separated member indices")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    indices = [int(i) for i in args.members.split(",")]
    models, study, _ = baselines.trained(args.workdir, indices)
    labels = np.asarray(study.test.labels)
    for m, model in zip(indices, models, strict=True):
        method = Method(f"member_{m}", methods.single(model), model.params)
        logits = predict(method, study.test, args.batch, progress=False)[:, 0]  # [N, C]
        log_probs = log_softmax(logits.astype(np.float64), axis=-1)
        accuracy = float(np.mean(logits.argmax(-1) == labels))
        nll = float(-np.mean(log_probs[np.arange(len(labels)), labels]))
        print(f"member {m}: test accuracy {100 * accuracy:.2f}%, NLL {nll:.4f} "
              f"({len(labels)} examples)")  # fmt: skip


if __name__ == "__main__":
    main()
