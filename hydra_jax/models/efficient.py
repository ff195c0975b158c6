"""BatchEnsemble and LoRA-Ensemble: M members of one single-encoder model in one forward pass.

Both are transforms of a model of the architecture table (any family with a single encoder):
its own Flax module runs `vmap`ped over a member axis of a few extra weights, and each dense
layer they act on is intercepted (`nn.intercept_methods`), so no family needs code of its own
and no member's weights are ever copied.

Weights: `{"shared": the model's weights, "members": {"adapters": {layer: ...}, "params": ...}}`;
every leaf under `members` has a leading member axis M (the mesh's `member` axis).
- BatchEnsemble (`BatchEnsembleConfig`): every dense layer `layer` (a `/`-joined module path) has
  `adapters[layer] = {"r": [M, in...], "s": [M, out...], "bias": [M, out...]}` and computes
  `y = ((x * r_m) W) * s_m + bias_m`: member m's kernel is `W * outer(r_m, s_m)`. Computed in
  this form, the shared product `x W` runs on every member's rows at once. The model's own bias
  of such a layer is not a weight of the ensemble (`shared` leaves it out; the member biases
  start from it).
- LoRA-Ensemble (`LoraEnsembleConfig`): each target attention projection has
  `adapters[layer] = {"a": [M, in..., R], "b": [M, R, out...]}` and computes
  `y = x W + b + (alpha / R) (x A_m) B_m`; with `member_heads`, `members["params"]` holds each
  member's classifier head (`CLASSIFIER_PARAMS`), stacked.

Dropout: member m draws from its own key (`jax.random.split` of the step's key).
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
from hydra_jax.models import dense
from hydra_jax.models.architectures import (
    CLASSIFIER_PARAMS,
    MemberConfig,
    dummy_inputs,
    module_of,
    weight_count,
)
from hydra_jax.models.outputs import ModelOutput

LORA_TARGETS = ("query", "key", "value", "out")


@dataclasses.dataclass(frozen=True)
class BatchEnsembleConfig:
    """BatchEnsemble (Wen et al., ICLR 2020) of one single-encoder model `member`.

    Every dense layer (attention projections, MLP, pooler, classifier) has a shared kernel W
    and, for each of the M members, rank-1 factors `r_m` (its inputs) and `s_m` (its outputs)
    and its own bias: member m's kernel is `W * outer(r_m, s_m)`. `factor_std`: the factors
    start as N(1, factor_std) draws (0: all ones, every member equal to `member`).
    """

    member: MemberConfig
    num_members: int
    factor_std: float = 0.5

    def __post_init__(self) -> None:
        checks.count("num_members", self.num_members)
        if not self.factor_std >= 0:
            raise ValueError(f"factor_std must be >= 0, got {self.factor_std}")


@dataclasses.dataclass(frozen=True)
class LoraEnsembleConfig:
    """LoRA-Ensemble (Muhlematter et al., 2024): M low-rank adapters on one frozen `member`.

    Member m adds `(alpha / rank) * x A_m B_m` to each attention projection named in `targets`
    (of `LORA_TARGETS`); with `member_heads` each member has its own classifier head (the
    model's `CLASSIFIER_PARAMS`), else the head is shared with the backbone.
    """

    member: MemberConfig
    num_members: int
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = LORA_TARGETS
    member_heads: bool = True

    def __post_init__(self) -> None:
        checks.count("num_members", self.num_members)
        checks.count("rank", self.rank)
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if not self.targets or unknown:
            raise ValueError(f"LoRA targets {list(self.targets)}: name some of {LORA_TARGETS}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


Params = Any
EfficientConfig = BatchEnsembleConfig | LoraEnsembleConfig


@dataclasses.dataclass(frozen=True)
class Dense:
    """A dense layer of a model: its kernel's shape, how many of its leading axes are inputs,
    and whether it has a bias."""

    kernel: tuple[int, ...]
    inputs: int
    bias: bool

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.kernel[: self.inputs]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.kernel[self.inputs :]


def _is_dense(context: Any) -> bool:
    return context.method_name == "__call__" and isinstance(
        context.module, dense.Dense | nn.Dense | nn.DenseGeneral
    )


@functools.cache
def dense_layers(config: MemberConfig) -> dict[str, Dense]:
    """Every dense layer of `config`'s model (ours, `nn.Dense`, `nn.DenseGeneral`), by module path
    (`encoder/layer_0/attention/query`), found by tracing its initialisation abstractly."""
    found: dict[str, Dense] = {}

    def record(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        out = next_fun(*args, **kwargs)
        if _is_dense(context):
            module = context.module
            kernel = module.variables["params"]["kernel"]
            axis = getattr(module, "axis", -1)
            inputs = len(axis) if isinstance(axis, tuple) else 1
            found["/".join(module.path)] = Dense(tuple(kernel.shape), inputs, module.use_bias)
        return out

    module = module_of(config)
    with nn.intercept_methods(record):
        jax.eval_shape(lambda: module.init(jax.random.key(0), **dummy_inputs(config)))
    return found


def adapted_layers(config: EfficientConfig) -> dict[str, Dense]:
    """The dense layers the ensemble adapts: all (BatchEnsemble), or the LoRA targets."""
    layers = dense_layers(config.member)
    if isinstance(config, BatchEnsembleConfig):
        return layers
    return {path: d for path, d in layers.items() if path.split("/")[-1] in config.targets}


def _lead(v: jax.Array, ndim: int) -> jax.Array:
    """`v` with leading unit axes up to `ndim` (explicit broadcasting)."""
    return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def _batch_ensemble_layer(own: Params, layer: Dense, x: jax.Array, call: Callable) -> jax.Array:
    y = call(x * _lead(own["r"].astype(x.dtype), x.ndim))  # the shared bias is zero
    y = y * _lead(own["s"].astype(y.dtype), y.ndim)
    return y + _lead(own["bias"].astype(y.dtype), y.ndim) if layer.bias else y


def _lora_layer(scale: float, own: Params, layer: Dense, x: jax.Array, call: Callable) -> jax.Array:
    low = jnp.tensordot(x, own["a"].astype(x.dtype), axes=layer.inputs)  # [..., R]
    delta = jnp.tensordot(low, own["b"].astype(x.dtype), axes=1)  # [..., out...]
    y = call(x)
    return y + (scale * delta).astype(y.dtype)


def _interceptor(config: EfficientConfig, adapters: Params) -> Callable:
    """Runs each adapted dense layer through its member's adapter (`adapters`: one member's)."""
    layers = adapted_layers(config)
    if isinstance(config, BatchEnsembleConfig):
        adapt = _batch_ensemble_layer
    else:
        adapt = functools.partial(_lora_layer, config.scale)

    def intercept(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        path = "/".join(context.module.path)
        if not _is_dense(context) or path not in layers:
            return next_fun(*args, **kwargs)
        (x,) = args
        own = adapters
        for name in context.module.path:
            own = own[name]
        return adapt(own, layers[path], x, lambda h: next_fun(h, **kwargs))

    return intercept


def _merge(shared: Params, own: Params) -> Params:
    flat = traverse_util.flatten_dict(shared)
    flat.update(traverse_util.flatten_dict(own))
    return traverse_util.unflatten_dict(flat)


def _zero_biases(config: EfficientConfig, shared: Params) -> Params:
    """`shared` with a zero bias at every BatchEnsemble layer (its member biases replace it)."""
    if not isinstance(config, BatchEnsembleConfig):
        return shared
    zeros = {
        (*path.split("/"), "bias"): jnp.zeros(layer.out_shape, jnp.float32)
        for path, layer in adapted_layers(config).items()
        if layer.bias
    }
    return _merge(shared, traverse_util.unflatten_dict(zeros))


def apply(
    config: EfficientConfig, params: Params, inputs: dict[str, Any], rng: jax.Array | None
) -> ModelOutput:
    """Runs every member in one pass: outputs with the member axis second (`logits`
    `[B, M, C]`, `last_hidden_state` `[B, M, T, D]`, ...)."""
    family = module_of(config.member)
    shared = _zero_biases(config, params["shared"])

    def member(own: Params, key: jax.Array | None) -> ModelOutput:
        variables = {"params": _merge(shared, own.get("params", {}))}
        rngs = None if key is None else {"dropout": key}
        with nn.intercept_methods(_interceptor(config, own["adapters"])):
            return family.apply(variables, **inputs, deterministic=key is None, rngs=rngs)

    M = config.num_members
    if rng is None:
        out = jax.vmap(lambda own: member(own, None))(params["members"])
    else:
        out = jax.vmap(member)(params["members"], jax.random.split(rng, M))
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), out)


def init_params(
    config: EfficientConfig, params: Params, rng: jax.Array, heads: list[Params] | None = None
) -> Params:
    """The ensemble's weights from one model's weights `params` (of `config.member`).

    BatchEnsemble: factors N(1, `factor_std`), member biases the model's. LoRA: `a` as PEFT
    initialises it (uniform in +-1/sqrt(fan-in)), `b` zero, so every member starts as the model;
    member m's head is `heads[m]` (`CLASSIFIER_PARAMS` trees), or a copy of the model's.
    """
    M, flat = config.num_members, traverse_util.flatten_dict(params)
    layers = adapted_layers(config)
    keys = dict(zip(layers, jax.random.split(rng, max(1, len(layers))), strict=False))
    adapters: dict[tuple[str, ...], Params] = {}
    for path, layer in layers.items():
        r_key, s_key = jax.random.split(keys[path])
        if isinstance(config, BatchEnsembleConfig):
            std = config.factor_std
            own = {
                "r": 1 + std * jax.random.normal(r_key, (M, *layer.in_shape)),
                "s": 1 + std * jax.random.normal(s_key, (M, *layer.out_shape)),
            }
            if layer.bias:
                bias = flat.pop((*path.split("/"), "bias"))
                own["bias"] = jnp.broadcast_to(bias, (M, *bias.shape))
        else:
            bound = 1 / max(1, math.prod(layer.in_shape)) ** 0.5
            a_shape, b_shape = (M, *layer.in_shape, config.rank), (M, config.rank, *layer.out_shape)
            own = {
                "a": jax.random.uniform(r_key, a_shape, minval=-bound, maxval=bound),
                "b": jnp.zeros(b_shape),
            }
        adapters[tuple(path.split("/"))] = own
    members: dict[str, Params] = {"adapters": traverse_util.unflatten_dict(adapters)}
    if isinstance(config, LoraEnsembleConfig) and config.member_heads:
        names = [k for k in params if k in CLASSIFIER_PARAMS]
        if not names:
            raise ValueError("LoRA-Ensemble member heads: the model has no classifier head")
        heads = heads or [{k: params[k] for k in names}] * M
        if len(heads) != M:
            raise ValueError(f"{len(heads)} heads for {M} members")
        members["params"] = jax.tree.map(lambda *leaves: jnp.stack(leaves), *heads)
        flat = {k: v for k, v in flat.items() if k[0] not in names}
    return {"shared": traverse_util.unflatten_dict(flat), "members": members}


def trainable(config: EfficientConfig) -> Callable[[tuple[str, ...]], bool]:
    """Which weights train: all of a BatchEnsemble (factors and shared weights); only the
    adapters and member heads of a LoRA-Ensemble (its backbone stays frozen). A predicate for
    `fit(trainable=...)`."""
    if isinstance(config, BatchEnsembleConfig):
        return lambda path: True
    return lambda path: path[0] == "members"


def parameter_count(config: EfficientConfig, params: Params) -> int:
    """The ensemble's weight count by its formula, from the weights `params` of one model of
    `config.member`: BatchEnsemble adds `r`, `s` and a bias per member and layer and drops the
    shared biases; LoRA adds `R (in + out)` per member and target, and M - 1 more heads."""
    M, layers = config.num_members, adapted_layers(config).values()
    if isinstance(config, BatchEnsembleConfig):
        factors = sum(math.prod(d.in_shape) + math.prod(d.out_shape) for d in layers)
        biases = sum(math.prod(d.out_shape) for d in layers if d.bias)
        return weight_count(params) - biases + M * (factors + biases)
    adapters = sum(config.rank * (math.prod(d.in_shape) + math.prod(d.out_shape)) for d in layers)
    heads = weight_count({k: v for k, v in params.items() if k in CLASSIFIER_PARAMS})
    return weight_count(params) + M * adapters + (M - 1) * heads * config.member_heads
