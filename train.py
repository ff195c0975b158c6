"""Fine-tunes what the config names: `python train.py --config configs/NAME.py[:ARG] --workdir DIR`.

Killed and restarted with the same arguments, it resumes from the last checkpoint.
"""

from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

from hydra_jax import pipeline

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiment config file", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory for checkpoints and artefacts")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    config = _CONFIG.value
    if config.experiment != "baselines":
        raise app.UsageError(
            f"{config.experiment!r} configs have nothing to train; use evaluate.py"
        )
    pipeline.train(config, Path(_WORKDIR.value))


if __name__ == "__main__":
    app.run(main)
