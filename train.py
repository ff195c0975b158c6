"""Runs the training stage of an experiment config.

    python train.py --config configs/NAME.py[:VARIANT] --workdir DIR [--config.a.b=V]

Killed and restarted with the same arguments, it resumes from the last checkpoint. A workdir
belongs to one config: a run whose config differs in anything that changes a result is refused.
"""

from hydra_jax.experiments import cli

if __name__ == "__main__":
    cli.start(0)
