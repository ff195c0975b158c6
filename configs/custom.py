"""Your model, your data: the generic study, as `hydra-jax train --config custom` runs it.

    python train.py    --config configs/custom.py --workdir W --config.model=DIR \\
        --config.data.train=csv:train.csv --config.data.test=csv:test.csv ...
    python evaluate.py --config configs/custom.py --workdir W   (the same fields)

The config and its fields live in the package (`hydra_jax/experiments/custom.py`, whose
docstring describes them) so that an installed hydra_jax runs it without this repository.
"""

from hydra_jax.experiments.custom import get_config

__all__ = ["get_config"]
