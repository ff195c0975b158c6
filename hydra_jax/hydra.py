"""Hydra Ensembles: member head sets, fusion of pruned members into one single-pass network.

Member head sets are bool `[M, L, N]` with `keep_per_layer = N // M` heads per layer:

- `taylor`: member m scores heads (HIS) on its own calibration subset (seed m), keeps its
  per-layer top n.
- `circuit`: HeadMap's layer-conditioned search (`hydra_jax.heads.circuit`), member m with its
  own objective and uncertainty-validation subset.
- `hies` (ours): member m ranks heads by HIES with its own alpha.
- `stratified` (ours): a layer's heads ranked by one score and dealt round-robin, so the members'
  head sets are disjoint and of equal quality.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from hydra_jax.heads import compact, hies, his_and_entropy, keep_mask
from hydra_jax.models import BertConfig, EncoderConfig, HydraConfig, Model

# Leaves every member shares after fusion (element-wise mean): the embedding tables and the MLPs.
_SHARED_ROOTS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def _is_shared(path: tuple[str, ...]) -> bool:
    return path[0] in _SHARED_ROOTS or (path[0] == "encoder" and path[2] == "mlp")


def fuse(members: Sequence[Model]) -> Model:
    """One network running every member in a single pass; `fused(**batch).logits` is `[B, M, C]`.

    Per member: q/k/v/o (sliced to its kept heads), LayerNorms, pooler and classifier, stacked on
    a leading M axis. Shared: the element-wise mean of the members' MLPs and embedding tables.
    With identical MLPs and embeddings (members not fine-tuned after pruning) member m's logits
    equal member m run alone.

    Args:
      members: compacted BERT classifiers with equal per-layer head counts.

    Raises:
      ValueError: fewer than two members, or members of different architectures or head counts.
    """
    if len(members) < 2:
        raise ValueError(f"a Hydra needs at least two members, got {len(members)}")
    configs = [m.config for m in members]
    if not all(isinstance(c, BertConfig) and c.num_labels for c in configs):
        raise ValueError("Hydra members must be BERT sequence classifiers")
    counts = [c.encoder.num_heads for c in configs]
    if len(set(counts)) != 1:
        raise ValueError(
            "members have unequal head counts per layer: "
            + "; ".join(f"member {i}: {list(c)}" for i, c in enumerate(counts))
        )
    if len(set(configs)) != 1:
        raise ValueError("members differ in architecture (besides their kept heads)")
    flat = [traverse_util.flatten_dict(m.params) for m in members]
    fused = {}
    for path in flat[0]:
        leaves = jnp.stack([jnp.asarray(f[path]) for f in flat])  # [M, ...]
        fused[path] = leaves.mean(0) if _is_shared(path) else leaves
    return Model(HydraConfig(configs[0], len(members)), traverse_util.unflatten_dict(fused))


def with_shared_weights(members: Sequence[Model]) -> list[Model]:
    """Each member with the members' mean MLPs and embedding tables: what fusion computes."""
    flat = [traverse_util.flatten_dict(m.params) for m in members]
    shared = {p: jnp.stack([f[p] for f in flat]).mean(0) for p in flat[0] if _is_shared(p)}
    return [
        Model(m.config, traverse_util.unflatten_dict({**f, **shared}))
        for m, f in zip(members, flat, strict=True)
    ]


def members_from(model: Model, head_sets: np.ndarray) -> list[Model]:
    """Compacted copies of `model`, one per head set `[M, L, N]`."""
    return [compact(model, keep) for keep in np.asarray(head_sets, bool)]


def stratified_head_sets(scores: np.ndarray, num_members: int) -> np.ndarray:
    """Round-robin deal of each layer's heads in score order: rank r goes to member r mod M."""
    scores = np.asarray(scores)
    L, N = scores.shape
    if N % num_members:
        raise ValueError(f"{N} heads per layer do not split evenly into {num_members} members")
    sets = np.zeros((num_members, L, N), bool)
    for l in range(L):
        for rank, head in enumerate(np.argsort(-scores[l], kind="stable")):
            sets[rank % num_members, l, head] = True
    return sets


def taylor_head_sets(
    model: Model, calibration: Sequence[Sequence[dict]], keep_per_layer: int
) -> np.ndarray:
    """Member m keeps its per-layer top-n by HIS on its own calibration batches `calibration[m]`."""
    return np.stack(
        [
            keep_mask(his_and_entropy(model, c)[0], keep_per_layer=keep_per_layer)
            for c in calibration
        ]
    )


def hies_head_sets(
    model: Model, calibration: Sequence[dict], alphas: Sequence[float], keep_per_layer: int
) -> np.ndarray:
    """Member m keeps its per-layer top-n by HIES with `alphas[m]` (one shared calibration)."""
    his, entropy = his_and_entropy(model, calibration)
    return np.stack(
        [keep_mask(hies(his, entropy, a), keep_per_layer=keep_per_layer) for a in alphas]
    )


def save(model: Model, path: str | Path) -> None:
    """Writes a fused Hydra (config JSON + orbax parameter checkpoint) to `path`."""
    if not isinstance(model.config, HydraConfig):
        raise TypeError(f"expected a fused Hydra model, got {type(model.config).__name__}")
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    (path / "hydra_config.json").write_text(json.dumps(dataclasses.asdict(model.config), indent=2))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "params", model.params, force=True)
    checkpointer.wait_until_finished()


def load(path: str | Path) -> Model:
    """Restores a fused Hydra written by `save`."""
    path = Path(path).absolute()
    raw = json.loads((path / "hydra_config.json").read_text())
    member = raw["member"]
    encoder = EncoderConfig(
        **{**member["encoder"], "num_heads": tuple(member["encoder"]["num_heads"])}
    )
    config = HydraConfig(BertConfig(**{**member, "encoder": encoder}), raw["num_members"])
    target = jax.eval_shape(lambda: Model.init(config, jax.random.key(0)).params)
    return Model(config, ocp.StandardCheckpointer().restore(path / "params", target))
