"""Member head sets for Hydra Ensembles: bool `[M, L, N]`, `keep_per_layer` heads per layer.

- `taylor`: member m scores heads (HIS) on its own calibration batches (seed m), keeps its
  per-layer top n.
- `circuit`: HeadMap's layer-conditioned search (`hydra_jax.heads.CircuitSearch`), member m with
  its own objective and uncertainty-validation subset.
- `hies` (ours): member m ranks heads by HIES with its own alpha.
- `stratified` (ours): a layer's heads ranked by one score and dealt round-robin, so the members'
  head sets are disjoint and of equal quality.

Calibration and validation data arrive as batches (dicts of model inputs): this module knows
nothing of datasets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from hydra_jax import checks
from hydra_jax.heads import (
    CircuitSearch,
    UncertaintyBatches,
    check_scores,
    hies,
    his_and_entropy,
    keep_mask,
)
from hydra_jax.models import Model

Batch = dict[str, np.ndarray]


def stratified_head_sets(scores: np.ndarray, num_members: int) -> np.ndarray:
    """Round-robin deal of each layer's heads in score order: rank r goes to member r mod M."""
    scores = check_scores(scores)
    checks.count("num_members", num_members)
    L, N = scores.shape
    if N % num_members:
        raise ValueError(f"{N} heads per layer do not split evenly into {num_members} members")
    sets = np.zeros((num_members, L, N), bool)
    for l in range(L):
        for rank, head in enumerate(np.argsort(-scores[l], kind="stable")):
            sets[rank % num_members, l, head] = True
    return sets


def taylor_head_sets(
    model: Model, calibration: Sequence[Sequence[Batch]], keep_per_layer: int
) -> np.ndarray:
    """Member m keeps its per-layer top-n by HIS on its own calibration batches `calibration[m]`."""
    return np.stack(
        [
            keep_mask(his_and_entropy(model, c)[0], keep_per_layer=keep_per_layer)
            for c in calibration
        ]
    )


def hies_head_sets(
    model: Model, calibration: Sequence[Batch], alphas: Sequence[float], keep_per_layer: int
) -> np.ndarray:
    """Member m keeps its per-layer top-n by HIES with `alphas[m]` (one shared calibration)."""
    his, entropy = his_and_entropy(model, calibration)
    return np.stack(
        [keep_mask(hies(his, entropy, a), keep_per_layer=keep_per_layer) for a in alphas]
    )


def circuit_head_sets(
    model: Model,
    validation: Sequence[UncertaintyBatches],
    objectives: Sequence[str],
    keep_per_layer: int,
) -> np.ndarray:
    """Member m: the circuit search on `validation[m]` with `objectives[m % len(objectives)]`.

    One `CircuitSearch` serves every member, so its programs compile once.
    """
    if not objectives:
        raise ValueError("no circuit objectives: give at least one of 'nll', 'auroc', 'avg'")
    search = CircuitSearch(model)
    return np.stack(
        [
            search(data, keep_per_layer, objectives[m % len(objectives)])
            for m, data in enumerate(tqdm(validation, desc="circuit search", leave=False))
        ]
    )


# What each strategy reads, per member: labelled calibration batches, or ID + OOD validation
# batches (`UncertaintyBatches`) for the circuit search.
STRATEGIES = {
    "taylor": "calibration",
    "circuit": "uncertainty",
    "hies": "calibration",
    "stratified": "calibration",
}


def heads_per_member(model: Model, num_members: int) -> int:
    """How many heads per layer each of `num_members` Hydra members of `model` keeps (N / M).

    Raises:
      ValueError: `num_members` is not a positive integer or does not divide the heads per layer.
    """
    checks.count("num_members", num_members)
    heads = model.config.encoder.num_heads[0]
    if heads % num_members:
        raise ValueError(f"{num_members} members do not divide the {heads} heads per layer")
    return heads // num_members


def head_sets(
    strategy: str,
    model: Model,
    num_members: int,
    *,
    calibration: Sequence[Sequence[Batch]] = (),
    uncertainty: Sequence[UncertaintyBatches] = (),
    alphas: Sequence[float] = (),
    objectives: Sequence[str] = (),
) -> np.ndarray:
    """Member head sets `[M, L, N]` of `strategy`, each member keeping N / M heads per layer.

    Args:
      strategy: a key of `STRATEGIES`.
      model: the classifier whose heads are chosen.
      num_members: M; it must divide the heads per layer.
      calibration: per member, labelled batches (`taylor`: member m scores on its own;
        `hies`, `stratified`: member 0's serve all).
      uncertainty: per member, ID + OOD validation batches (`circuit`).
      alphas: HIES's alpha per member (`hies`).
      objectives: the circuit objective per member, cycled (`circuit`).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown member strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    n = heads_per_member(model, num_members)
    data = calibration if STRATEGIES[strategy] == "calibration" else uncertainty
    if len(data) < num_members:
        raise ValueError(
            f"strategy {strategy!r} needs {STRATEGIES[strategy]} data for each of "
            f"{num_members} members; {len(data)} given"
        )
    if strategy == "taylor":
        return taylor_head_sets(model, calibration[:num_members], n)
    if strategy == "hies":
        if len(alphas) != num_members:
            raise ValueError(
                f"hies needs one alpha per member: {num_members} members, alphas {list(alphas)}"
            )
        return hies_head_sets(model, calibration[0], alphas, n)
    if strategy == "stratified":
        return stratified_head_sets(his_and_entropy(model, calibration[0])[0], num_members)
    return circuit_head_sets(model, uncertainty[:num_members], objectives, n)
