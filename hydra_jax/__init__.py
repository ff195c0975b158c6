"""hydra_jax: uncertainty-aware, efficient transformers (Hydra Ensembles, HIES) in JAX."""

from hydra_jax import data, heads, hydra, metrics, models
from hydra_jax.convert import ConversionError, from_pretrained, minilm_l6_path, save_pretrained
from hydra_jax.models import Model

__all__ = [
    "ConversionError",
    "Model",
    "data",
    "from_pretrained",
    "heads",
    "hydra",
    "metrics",
    "minilm_l6_path",
    "models",
    "save_pretrained",
]
