"""Packed-Ensembles: M narrow members of one architecture, trained from scratch, in one pass.

A Packed-Ensemble of a base model (width D, N heads per layer, MLP width F) with width factor
`alpha` and `gamma` groups per member is, member by member, a model of the same family with
width `alpha D / M`, `gamma N` heads of width `alpha D / (M gamma N)` and MLP width
`alpha F / M` (`packed_member`); its encoder layers' dense layers (q, k, v, out, fc1, fc2) are
grouped: block-diagonal with `gamma` blocks, block g mapping the g-th slice of its inputs to
the g-th slice of its outputs (for attention: the g-th group of N heads). The members' own
embeddings, norms (over a member's whole width: the paper's group norm with M groups) and heads
are dense. This is the grouped-convolution network of the paper, executed as `vmap` over the
members and a batched (grouped) product per layer: no block of zeros is stored or multiplied.

Weights: `{"members": member weight trees stacked [M, ...]}`; a grouped layer's `kernel` is
`[gamma, in_0 / gamma, in_rest..., out_0 / gamma, out_rest...]` (its first input and first
output axes split into blocks); its bias keeps the dense shape. Packed-Ensembles cannot start
from pretrained weights (the members are narrower than any checkpoint): `Model.init` draws
every member as its family initialises a model, restricted to the grouped layers' blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from hydra_jax import checks
from hydra_jax.models.architectures import (
    MemberConfig,
    module_of,
    single_tower,
    tower_encoder,
    weight_count,
    with_tower_encoder,
)
from hydra_jax.models.dense import wide_dtype
from hydra_jax.models.efficient import Dense, dense_layers
from hydra_jax.models.outputs import ModelOutput


@dataclasses.dataclass(frozen=True)
class PackedEnsembleConfig:
    """Packed-Ensembles (Laurent et al., ICLR 2023): M narrow members, trained from scratch, in
    one network.

    `member` is each member's architecture (`hydra_jax.models.packed.packed_member`: a base
    model's at `alpha` times its width, split M ways, with `groups` times its heads). With
    `groups` (the paper's gamma) > 1 every dense layer of a member's encoder layers is grouped:
    block-diagonal with `groups` blocks, each holding whole heads.
    """

    member: MemberConfig
    num_members: int
    groups: int = 1

    def __post_init__(self) -> None:
        checks.count("num_members", self.num_members)
        checks.count("groups", self.groups)


Params = Any
GROUPED = {"attention": ("query", "key", "value", "out"), "mlp": ("fc1", "fc2")}


def packed_member(base: MemberConfig, num_members: int, alpha: float, groups: int) -> MemberConfig:
    """Each member's architecture: `base`'s at width `alpha D / M` with `groups` x its heads.

    Raises:
      ValueError: widths that do not divide into members, groups and heads; a gated MLP with
        several groups (its gate and value halves would fall into different blocks).
    """
    tower = single_tower(base)
    if tower is None:
        raise TypeError(f"packed_member takes a single-encoder model, not {type(base).__name__}")
    e, M = tower_encoder(base, tower), num_members
    if len(set(e.num_heads)) != 1 or e.width != e.num_heads[0] * e.head_dim:
        raise ValueError("Packed-Ensembles need an unpruned base: equal heads, N * K == D")
    width, mlp = alpha * e.width / M, alpha * e.mlp_dim / M
    heads = groups * e.num_heads[0]
    if width != int(width) or int(width) % heads or mlp != int(mlp) or int(mlp) % groups:
        raise ValueError(
            f"alpha={alpha}, M={M}, gamma={groups}: member width alpha*D/M = {width:g} must be a "
            f"whole multiple of gamma*N = {heads} heads, and the member MLP alpha*F/M = {mlp:g} "
            f"of gamma (D={e.width}, N={e.num_heads[0]}, F={e.mlp_dim})"
        )
    if groups > 1 and e.gated_mlp:
        raise ValueError("a gated MLP cannot be grouped (gamma > 1): its halves would split")
    encoder = dataclasses.replace(
        e,
        num_heads=(heads,) * e.num_layers,
        width=int(width),
        head_dim=int(width) // heads,
        mlp_dim=int(mlp),
    )
    return with_tower_encoder(base, tower.config, encoder)


@functools.cache
def grouped_layers(config: PackedEnsembleConfig) -> dict[str, Dense]:
    """The member's grouped dense layers by module path (none with one group)."""
    if config.groups == 1:
        return {}
    return {
        path: layer
        for path, layer in dense_layers(config.member).items()
        if (names := path.split("/"))[-1] in GROUPED.get(names[-2] if len(names) > 1 else "", ())
    }


def to_blocks(kernel: jax.Array, inputs: int, groups: int) -> jax.Array:
    """The `groups` diagonal blocks of a dense kernel `[in..., out...]`: `[G, in_0 / G, ...,
    out_0 / G, ...]` (block g maps slice g of the first input axis to slice g of the first
    output axis)."""
    i0, o0 = kernel.shape[0], kernel.shape[inputs]
    split = kernel.reshape(
        groups,
        i0 // groups,
        *kernel.shape[1:inputs],
        groups,
        o0 // groups,
        *kernel.shape[inputs + 1 :],
    )
    taken = jnp.diagonal(split, axis1=0, axis2=inputs + 1)  # the group axis goes last
    return jnp.moveaxis(taken, -1, 0)


def from_blocks(blocks: jax.Array, inputs: int) -> jax.Array:
    """The block-diagonal dense kernel `[in..., out...]` of grouped `blocks` (zeros elsewhere)."""
    G = blocks.shape[0]
    eye = jnp.eye(G, dtype=blocks.dtype)
    in_block, out_block = blocks.shape[1 : 1 + inputs], blocks.shape[1 + inputs :]
    # [G, in_0/G, in..., G, out_0/G, out...] with block (g, h) = blocks[g] * (g == h)
    full = blocks[:, *(slice(None),) * inputs, None] * eye.reshape(
        (G,) + (1,) * inputs + (G,) + (1,) * len(out_block)
    )
    return full.reshape(G * in_block[0], *in_block[1:], G * out_block[0], *out_block[1:])


def grouped_dense(
    x: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None,
    inputs: int,
    dtype: jnp.dtype | None,
    out_dtype: jnp.dtype | None = None,
) -> jax.Array:
    """`x @ from_blocks(kernel) + bias`, block by block: x `[..., in...]` -> `[..., out...]`,
    multiplied in `dtype`, returned in `out_dtype` (None: `dtype`)."""
    G, lead = kernel.shape[0], x.ndim - inputs
    dtype = dtype or jnp.result_type(x, kernel)
    out_dtype = out_dtype or dtype
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    xs = x.reshape(*x.shape[:lead], G, x.shape[lead] // G, *x.shape[lead + 1 :])
    contract = (tuple(range(lead + 1, lead + 1 + inputs)), tuple(range(1, 1 + inputs)))
    wide = wide_dtype(dtype)  # narrow products accumulate in float32 and are rounded once
    dims = (contract, ((lead,), (0,)))
    y = jax.lax.dot_general(xs, kernel, dims, preferred_element_type=wide)  # [G, ..., out_0/G, ...]
    y = jnp.moveaxis(y, 0, lead)
    y = y.reshape(*y.shape[:lead], G * y.shape[lead + 1], *y.shape[lead + 2 :])
    if bias is not None:
        y = y + bias.astype(wide).reshape((1,) * lead + bias.shape)
    return y.astype(out_dtype)


def _interceptor(config: PackedEnsembleConfig) -> Callable:
    layers = grouped_layers(config)

    def intercept(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        path = "/".join(module.path)
        if context.method_name != "__call__" or path not in layers:
            return next_fun(*args, **kwargs)
        weights = module.variables["params"]
        (x,) = args
        return grouped_dense(
            x, weights["kernel"], weights.get("bias"), layers[path].inputs, module.dtype,
            getattr(module, "out_dtype", None),
        )  # fmt: skip

    return intercept


def apply(
    config: PackedEnsembleConfig, params: Params, inputs: dict[str, Any], rng: jax.Array | None
) -> ModelOutput:
    """Every member on the same inputs in one pass: outputs with the member axis second."""
    family = module_of(config.member)

    def member(own: Params, key: jax.Array | None) -> ModelOutput:
        rngs = None if key is None else {"dropout": key}
        with nn.intercept_methods(_interceptor(config)):
            return family.apply({"params": own}, **inputs, deterministic=key is None, rngs=rngs)

    if rng is None:
        out = jax.vmap(lambda own: member(own, None))(params["members"])
    else:
        out = jax.vmap(member)(params["members"], jax.random.split(rng, config.num_members))
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), out)


def grouped_params(config: PackedEnsembleConfig, member: Params) -> Params:
    """One member's dense weights (of `config.member`) with each grouped layer's kernel cut to
    its diagonal blocks."""
    flat = traverse_util.flatten_dict(member)
    for path, layer in grouped_layers(config).items():
        key = (*path.split("/"), "kernel")
        flat[key] = to_blocks(flat[key], layer.inputs, config.groups)
    return traverse_util.unflatten_dict(flat)


def init_params(config: PackedEnsembleConfig, members: list[Params]) -> Params:
    """`{"members": stacked}` from M member weight trees of `config.member` (dense kernels)."""
    grouped = [grouped_params(config, p) for p in members]
    return {"members": jax.tree.map(lambda *leaves: jnp.stack(leaves), *grouped)}


def parameter_count(config: PackedEnsembleConfig, member: Params) -> int:
    """The ensemble's weight count from one member's weights (or their shapes): M dense members
    less the off-diagonal blocks of each grouped layer."""
    G, layers = config.groups, grouped_layers(config).values()
    off_diagonal = sum(math.prod(d.kernel) * (G - 1) // G for d in layers)
    return config.num_members * (weight_count(member) - off_diagonal)
