"""A study over training seeds: mean +- std per method across evaluated workdirs (one per study
seed) and the mean OOD AUROC differences with paired bootstrap intervals pooled over seeds.

    python seeds.py --workdirs runs/demo,runs/demo_seed1,runs/demo_seed2 \
        --pairs hydra_circuit:deep_ensemble,hydra_taylor:deep_ensemble --out runs/demo_seeds.md
"""

from pathlib import Path

from absl import app, flags

from hydra_jax.evaluation import seeds
from hydra_jax.experiments import compare

_WORKDIRS = flags.DEFINE_list("workdirs", None, "evaluated workdirs, one per study seed")
_PAIRS = flags.DEFINE_list("pairs", [], "A:B method pairs whose AUROC difference to report")
_TITLE = flags.DEFINE_string("title", "", "report title (default: the first run's title)")
_OUT = flags.DEFINE_string("out", "", "write the markdown here as well as to stdout")
_RESAMPLES = flags.DEFINE_integer("resamples", 1000, "bootstrap resamples")
flags.mark_flags_as_required(["workdirs"])


def main(argv: list[str]) -> None:
    del argv
    workdirs = [Path(w) for w in _WORKDIRS.value]
    results = seeds.load_results(workdirs)
    pairs = [tuple(p.split(":")) for p in _PAIRS.value]
    if any(len(p) != 2 for p in pairs):
        raise app.UsageError(f"--pairs takes A:B method pairs, got {_PAIRS.value}")
    differences = {}
    for a, b in pairs:
        (row,) = compare.compare(workdirs, a, b, _RESAMPLES.value, only=("ood.mean.auroc",))
        differences[(a, b)] = {"difference": row.diff, "low": row.diff_low, "high": row.diff_high}
    title = _TITLE.value or results[0]["config"].get("title", "study") + ", over seeds"
    text = seeds.markdown(title, workdirs, seeds.summarize(results), differences)
    print(text)
    if _OUT.value:
        Path(_OUT.value).write_text(text)


if __name__ == "__main__":
    app.run(main)
