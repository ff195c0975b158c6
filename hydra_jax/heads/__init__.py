"""Head importance scores, head selection, head surgery and the circuit search."""

from hydra_jax.heads.circuit import CircuitSearch, UncertaintyBatches, circuit_search, harm
from hydra_jax.heads.compact import compact, expand_to_full
from hydra_jax.heads.scoring import attention_entropy, hies, his_and_entropy, score
from hydra_jax.heads.selection import check_scores, keep_mask

__all__ = [
    "CircuitSearch",
    "UncertaintyBatches",
    "attention_entropy",
    "check_scores",
    "circuit_search",
    "compact",
    "expand_to_full",
    "harm",
    "hies",
    "his_and_entropy",
    "keep_mask",
    "score",
]
