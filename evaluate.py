"""Runs the evaluation stage of an experiment config on the workdir its training stage filled.

    python evaluate.py --config configs/NAME.py[:VARIANT] --workdir DIR

Writes DIR/results.json (with the config it was evaluated with), DIR/report.md,
DIR/plots/*.png and DIR/predictions/NAME.npz. Refuses a config that differs from the workdir's.
"""

from hydra_jax.experiments import cli

if __name__ == "__main__":
    cli.start(1)
