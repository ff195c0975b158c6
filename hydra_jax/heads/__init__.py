"""Head importance scores, head selection and head surgery."""

from hydra_jax.heads.compact import compact, expand_to_full
from hydra_jax.heads.scoring import attention_entropy, hies, his_and_entropy, score
from hydra_jax.heads.selection import keep_mask

__all__ = [
    "attention_entropy",
    "compact",
    "expand_to_full",
    "hies",
    "his_and_entropy",
    "keep_mask",
    "score",
]
