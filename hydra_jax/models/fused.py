"""The fused Hydra network: M head-pruned members in one forward pass, for every family.

Weights come in two parts. `shared`: the embedding tables (token, position, patch, CLS) and every
layer's MLP, each the element-wise mean of the members'. `members`: everything else (attention,
every LayerNorm, pooler, classifier, projection) stacked on a leading M axis.

Forward: the member family's own `embed` stage, `vmap`ped over the member weights and the inputs
replicated M times, looks up the shared tables and applies each member's own norm, giving M
residual streams `[M, B, T, D]`; in every layer each member's attention runs on its own
stream (a grouped, block-diagonal projection: `vmap` over the member axis), the shared MLP runs
on each stream in turn, and the LayerNorms are per member, pre-LN (ViT, CLIP) or post-LN (BERT)
as the family's encoder is; the family's own `head` stage, `vmap`ped, gives `[B, M, C]` logits.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from hydra_jax.models.architectures import MemberConfig, architecture
from hydra_jax.models.attention import Attention
from hydra_jax.models.config import EncoderConfig
from hydra_jax.models.dropout import Dropout
from hydra_jax.models.encoder import (
    attention_block,
    channels,
    distance_embeddings,
    layer_bias,
    layer_norm,
    mlp_block,
)
from hydra_jax.models.outputs import ModelOutput
from hydra_jax.models.sharding import constrain, member_vmap, members_split, traced_mesh


@dataclasses.dataclass(frozen=True)
class HydraConfig:
    """M head-pruned members fused into one network (Hydra Ensembles).

    `member` is the members' common (compacted) architecture, any family with a single encoder:
    `member.encoder.num_heads` are the heads each member keeps per layer.
    """

    member: MemberConfig
    num_members: int


Params = Any


def is_shared(config: MemberConfig, path: tuple[str, ...]) -> bool:
    """Whether the member parameter at `path` is averaged into one shared copy."""
    return path[0] in (architecture(config).shared_tables or ()) or (
        path[0] == "encoder" and len(path) > 2 and path[2] == "mlp"
    )


def fuse_params(config: MemberConfig, members: Sequence[Params]) -> dict[str, Params]:
    """`{"shared": means, "members": stacks [M, ...]}` from M member weight trees of `config`."""
    flat = [traverse_util.flatten_dict(p) for p in members]
    shared = frozenset(path for path in flat[0] if is_shared(config, path))
    means, stacks = _stack_members(flat, shared)
    return {
        "shared": traverse_util.unflatten_dict(means),
        "members": traverse_util.unflatten_dict(stacks),
    }


@functools.partial(jax.jit, static_argnames="shared")
def _stack_members(
    flat: list[dict[tuple[str, ...], jax.Array]], shared: frozenset[tuple[str, ...]]
) -> tuple[dict, dict]:
    """Each path's M leaves stacked `[M, ...]`, the `shared` ones averaged; one program (run
    leaf by leaf, each stack and mean would compile on its own)."""
    means, stacks = {}, {}
    for path in flat[0]:
        leaves = jnp.stack([f[path] for f in flat])  # [M, ...]
        if path in shared:
            means[path] = leaves.mean(0)
        else:
            stacks[path] = leaves
    return means, stacks


def member_params(params: dict[str, Params], m: int) -> Params:
    """Member m's full weight tree as fusion sees it (shared parts included)."""
    return _merge(params["shared"], jax.tree.map(lambda x: x[m], params["members"]))


def _merge(shared: Params, member: Params) -> Params:
    flat = traverse_util.flatten_dict(shared)
    flat.update(traverse_util.flatten_dict(member))
    return traverse_util.unflatten_dict(flat)


# Dropout keys: layer l folds in 4l (attention) and 4l + 2 (MLP); the embedding and head stages
# fold in these (no encoder has a million layers).
_EMBED_SALT, _HEAD_SALT = 1_000_000, 1_000_001


def _keys(rng: jax.Array | None, M: int, salt: int) -> jax.Array | None:
    return None if rng is None else jax.random.split(jax.random.fold_in(rng, salt), M)


def _vmap(f, *args):
    """`f` over the member axis (split over the mesh's `member` axis where there is one); an
    argument that is None (no dropout key) is not mapped."""
    axes = tuple(None if a is None else 0 for a in args)
    return member_vmap(f, in_axes=axes)(*args)


def _streams(x: jax.Array) -> jax.Array:
    """Member streams `[M, B, T, D]` laid out on the mesh: members over `member`, rows over
    `data`."""
    return constrain(x, ("member", "batch", None, None))


class _Ops:
    """The per-layer building blocks, applied functionally to slices of the fused weights."""

    def __init__(self, e: EncoderConfig):
        self.e = e
        self.norm = layer_norm(e)
        self.mlp = mlp_block(e)
        self.drop = Dropout(e.dropout)

    def attention(self, l: int, n: int) -> Attention:
        return attention_block(self.e, l, n)

    def dropout(self, x: jax.Array, key: jax.Array | None) -> jax.Array:
        if key is None:
            return x
        return self.drop.apply({}, x, deterministic=False, rngs={"dropout": key})

    def layer_norm(self, p: Params, x: jax.Array) -> jax.Array:
        return self.norm.apply({"params": p}, x)


def _scaled(h: jax.Array, scale: jax.Array | None) -> jax.Array:
    """`h` times a layer scale `[D]` (None: no layer scale)."""
    return h if scale is None else h * channels(scale, h)


def _attend(ops: _Ops, attention: Attention, bias: jax.Array | None):
    """One member's attention block: `(weights, its norm or None, its layer scale or None,
    stream, dropout key, its distance embeddings or None) -> [B, T, D]`."""

    def attend(
        p: Params,
        norm: Params | None,
        scale: jax.Array | None,
        h: jax.Array,
        key: jax.Array | None,
        distances: jax.Array | None,
    ) -> jax.Array:
        if ops.e.pre_norm and norm is not None:
            h = ops.layer_norm(norm, h)
        rngs = None if key is None else {"dropout": key}
        out, _ = attention.apply({"params": p}, h, bias, None, key is None, distances, rngs=rngs)
        return ops.dropout(_scaled(out, scale), None if key is None else jax.random.fold_in(key, 1))

    return attend


def _layer(
    e: EncoderConfig,
    ops: _Ops,
    l: int,
    n: int,
    bias: jax.Array | None,
    own: Params,
    mlp: Params,
    x: jax.Array,
    rng: jax.Array | None,
    distances: jax.Array | None,
) -> jax.Array:
    """Fused layer `l` (`n` heads per member) on member streams `x` `[M, B, T, D]`: `own`, the
    members' stacked weights of the layer, `mlp` the shared MLP's."""
    M = x.shape[0]
    attend = _attend(ops, ops.attention(l, n), bias)
    keys = _keys(rng, M, 4 * l)
    scale = own.get("attention_scale")  # [M, D] with layer scale (DINOv2), else None
    first = own.get("attention_norm")  # None: ModernBERT's layer 0
    a = _vmap(attend, own["attention"], first, scale, x, keys, distances)
    norm = lambda p, h: _vmap(ops.layer_norm, p, h)  # noqa: E731
    if e.pre_norm:
        x = x + a
        h = norm(own["mlp_norm"], x)
    else:
        x = norm(own["attention_norm"], x + a)
        h = x
    # One shared MLP, applied stream by stream: on CPU each stream's [B, T, F] intermediate
    # stays in cache, where one [M, B, T, F] pass would not (`bench/ensemble.py` times the
    # fused forward). XLA FLOPs are the same. With members split over a mesh, each device
    # runs the MLP on its own members' streams: one pass over the member axis.
    if members_split(M):
        h = member_vmap(lambda s: ops.mlp.apply({"params": mlp}, s))(h)  # [M, B, T, D]
    else:
        h = jnp.stack([ops.mlp.apply({"params": mlp}, h[m]) for m in range(M)])
    h = _vmap(_scaled, h, own.get("mlp_scale"))
    h = _vmap(ops.dropout, h, _keys(rng, M, 4 * l + 2))
    return _streams(x + h if e.pre_norm else norm(own["mlp_norm"], x + h))


def encode(
    e: EncoderConfig,
    members: Params,
    shared: Params,
    x: jax.Array,
    bias: jax.Array | None,
    rng: jax.Array | None,
) -> jax.Array:
    """The fused layer stack on member streams `x` `[M, B, T, D]` -> `[M, B, T, D]`."""
    ops = _Ops(e)
    distances = None  # DeBERTa: each member's own distance embeddings [M, 2A, D]
    if e.relative is not None:
        distances = jax.vmap(lambda p: distance_embeddings(p, e))(members["encoder"])
    for l, n in enumerate(e.num_heads):
        own, mlp = members["encoder"][f"layer_{l}"], shared["encoder"][f"layer_{l}"]["mlp"]
        layer = functools.partial(_layer, e, ops, l, n, layer_bias(e, l, bias, x.shape[2]))
        x = (jax.checkpoint(layer) if e.remat else layer)(own, mlp, x, rng, distances)
    return x


def apply(
    config: HydraConfig,
    family: nn.Module,
    params: dict[str, Params],
    inputs: dict[str, Any],
    rng: jax.Array | None,
) -> ModelOutput:
    """Runs every member in one pass.

    Args:
      config: the fused architecture.
      family: the member family's module (`Bert`, `ViT`, `CLIPVision`), whose `embed` and `head`
        stages the fused network uses as they are.
      params: `{"shared", "members"}` weights (`fuse_params`).
      inputs: the member family's batch arrays.
      rng: a dropout key (training), or None.

    Returns:
      Member outputs with the member axis second: `logits` `[B, M, C]`, `pooler_output`
      `[B, M, D]`, `last_hidden_state` `[B, M, T, D]` (and `embeds` `[B, M, E]` for towers).
    """
    M, shared, members = config.num_members, params["shared"], params["members"]

    def stage(name: str, own: Params, key: jax.Array | None, *args: Any, **kwargs: Any) -> Any:
        rngs = None if key is None else {"dropout": key}
        method = getattr(type(family), name)
        variables = {"params": _merge(shared, own)}
        return family.apply(
            variables, *args, method=method, rngs=rngs, deterministic=rng is None, **kwargs
        )

    embed = lambda own, key, inp: stage("embed", own, key, **inp)  # noqa: E731
    # Inputs replicated per member: each member's embedding norm then reduces a [M, B, T, D]
    # stream as the earlier fused module did, and XLA rounds it identically (with unbatched
    # inputs it computed the statistics once on [B, T, D], 2e-6 apart at some padded lengths).
    # The table lookups run M times (gathers; a small patch conv for images): no measurable cost.
    # On a mesh of several devices the inputs are not copied: a copy's rows merged with the
    # member axis (as vmap does for the shared patch convolution) would lose the mesh's split of
    # the rows, and every device would embed the whole batch.
    keys = _keys(rng, M, _EMBED_SALT)
    mesh = traced_mesh()
    if mesh is None or mesh.size == 1:
        replicated = jax.tree.map(lambda v: jnp.broadcast_to(v, (M, *v.shape)), inputs)
        stems = _vmap(embed, members, keys, replicated)
    else:
        in_axes = (0, None if keys is None else 0, None)
        stems = member_vmap(embed, in_axes=in_axes)(members, keys, inputs)
    bias = None if stems.bias is None else stems.bias[0]  # the same for every member
    hidden = _streams(stems.hidden)
    x = encode(config.member.encoder, members, shared, hidden, bias, rng)  # [M, B, T, D]
    key_mask = None if stems.key_mask is None else stems.key_mask[0]  # [B, S], every member's
    head = lambda own, h, key: stage("head", own, key, h, key_mask=key_mask)  # noqa: E731
    out = _vmap(head, members, x, _keys(rng, M, _HEAD_SALT))
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), out)  # [B, M, ...]
