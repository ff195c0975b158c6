"""Embedded datasets (TFDS builders on registry-hosted sources), tokenisation and batching."""

from hydra_jax.data.sentences import NO_LABEL, Sentences, load, prepare
from hydra_jax.data.sources import default_data_dir

__all__ = ["NO_LABEL", "Sentences", "default_data_dir", "load", "prepare"]
