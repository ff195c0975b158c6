"""Fusion of head-pruned members into one single-pass network.

`fuse` takes compacted members of one family (BERT or ViT classifiers, CLIP vision towers) with
equal per-layer head counts. The fused network (`hydra_jax.models.fused`) averages the members'
embedding tables and MLPs and keeps everything else per member.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from hydra_jax.heads import compact
from hydra_jax.models import HydraConfig, Model, kinds, member_of
from hydra_jax.models.architectures import architecture
from hydra_jax.models.fused import fuse_params, member_params


def fuse(members: Iterable[Model]) -> Model:
    """One network running every member in a single pass; `fused(**batch).logits` is `[B, M, C]`.

    Per member: q/k/v/o (sliced to its kept heads), every LayerNorm, the head (pooler,
    classifier, projection), stacked on a leading M axis. Shared: the element-wise mean of the
    members' MLPs and embedding tables. With identical MLPs and embeddings (members not
    fine-tuned after pruning), member m's outputs equal member m run alone.

    Args:
      members: compacted BERT or ViT classifiers, or CLIP vision towers, with equal per-layer
        head counts; any iterable (a list, a generator).

    Raises:
      ValueError: fewer than two members, or members of different families, architectures or
        head counts.
    """
    members = list(members)
    if len(members) < 2:
        raise ValueError(f"a Hydra needs at least two members, got {len(members)}")
    configs = [m.config for m in members]
    kinds = {type(c) for c in configs}
    fusable = all(
        member_of(c) is None and architecture(c).shared_tables is not None for c in configs
    )
    if len(kinds) != 1 or not fusable:
        raise ValueError(
            "Hydra members must all be BERT-family or ViT-family classifiers, or all CLIP vision "
            "towers; "
            f"got {[type(c).__name__ for c in configs]}"
        )
    counts = [c.encoder.num_heads for c in configs]
    if len(set(counts)) != 1:
        raise ValueError(
            "members have unequal head counts per layer: "
            + "; ".join(f"member {i}: {list(c)}" for i, c in enumerate(counts))
        )
    if len(set(configs)) != 1:
        raise ValueError("members differ in architecture (besides their kept heads)")
    config = HydraConfig(configs[0], len(members))
    return Model(config, fuse_params(configs[0], [m.params for m in members]))


def unfuse(model: Model) -> list[Model]:
    """The members as fusion sees them (shared weights included), each a model of its own."""
    kind = kinds.kind_of(model.config)
    if kind is None or kind.name != "hydra":
        raise TypeError(f"expected a fused Hydra model, got {type(model.config).__name__}")
    member = model.config.member
    return [Model(member, member_params(model.params, m)) for m in range(model.config.num_members)]


def with_shared_weights(members: Sequence[Model]) -> list[Model]:
    """Each member with the members' mean MLPs and embedding tables: what fusion computes."""
    return unfuse(fuse(members))


def members_from(model: Model, head_sets: np.ndarray) -> list[Model]:
    """Compacted copies of `model`, one per head set `[M, L, N]`."""
    head_sets = np.asarray(head_sets)
    if head_sets.ndim != 3:
        raise ValueError(f"head_sets must be [M, L, N], got shape {head_sets.shape}")
    return [compact(model, keep) for keep in head_sets]
