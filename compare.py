"""Mean OOD AUROC of two evaluated methods, with a paired bootstrap 95% interval of the difference.

    python compare.py --workdir runs/demo --a hydra_taylor --b deep_ensemble [--score msp]

Reads `WORKDIR/predictions/{A,B}.npz` (written by evaluate.py); the interval resamples the test
sentences (ID and each OOD set), the same draw for both methods, so it reflects test-set size,
not training-seed variation.
"""

from pathlib import Path

import numpy as np
from absl import app, flags

from hydra_jax import metrics
from hydra_jax.evaluation.seeds import ood_scores

_WORKDIR = flags.DEFINE_string("workdir", None, "an evaluated workdir (holds predictions/)")
_A = flags.DEFINE_string("a", None, "method a")
_B = flags.DEFINE_string("b", None, "method b")
_SCORE = flags.DEFINE_enum("score", "msp", ["msp", "entropy", "energy", "mi"], "OOD score")
_RESAMPLES = flags.DEFINE_integer("resamples", 1000, "bootstrap resamples")
flags.mark_flags_as_required(["workdir", "a", "b"])


def main(argv: list[str]) -> None:
    del argv
    directory = Path(_WORKDIR.value) / "predictions"
    id_a, ood_a = ood_scores(directory / f"{_A.value}.npz", _SCORE.value)
    id_b, ood_b = ood_scores(directory / f"{_B.value}.npz", _SCORE.value)
    if sorted(ood_a) != sorted(ood_b):
        raise app.UsageError(f"the methods were evaluated on different OOD sets: "
                             f"{sorted(ood_a)} vs {sorted(ood_b)}")  # fmt: skip
    names = sorted(ood_a)
    result = metrics.auroc_difference(id_a, [ood_a[n] for n in names], id_b,
                                      [ood_b[n] for n in names], _RESAMPLES.value)  # fmt: skip
    for name, (id_s, ood_s) in ((_A.value, (id_a, ood_a)), (_B.value, (id_b, ood_b))):
        mean = np.mean([metrics.ood(id_s, ood_s[n])["auroc"] for n in names])
        print(f"{name}: mean OOD AUROC {100 * mean:.2f} ({_SCORE.value}; {', '.join(names)})")
    print(f"{_A.value} - {_B.value}: {100 * result['difference']:+.2f} points, 95% paired "
          f"bootstrap interval [{100 * result['low']:+.2f}, {100 * result['high']:+.2f}] "
          f"({_RESAMPLES.value} resamples of the test examples)")  # fmt: skip


if __name__ == "__main__":
    app.run(main)
