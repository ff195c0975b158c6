"""Evaluates a trained workdir: `python evaluate.py --config configs/NAME.py[:ARG] --workdir DIR`.

Writes DIR/results.json, DIR/report.md, DIR/plots/*.png and DIR/predictions/NAME.npz.
"""

from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

from hydra_jax import hydra_pipeline, pipeline, pruning

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiment config file", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory holding the trained members")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    config, workdir = _CONFIG.value, Path(_WORKDIR.value)
    experiments = {
        "baselines": pipeline.evaluate,
        "pruning": pruning.run,
        "hydra": hydra_pipeline.run,
    }
    experiments[config.experiment](config, workdir)


if __name__ == "__main__":
    app.run(main)
