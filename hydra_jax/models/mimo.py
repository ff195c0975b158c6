"""MIMO (Havasi et al., ICLR 2021): M members in one image classifier, one forward pass.

The network is the member's architecture with `M x C` input channels and `M x K` classes
(`network`): a ViT's patch embedding reads M images stacked on the channel axis, member m's in
channels `m C .. (m + 1) C`, and member m's logits are classes `m K .. (m + 1) K` of the one
classifier. Everything between is shared, so the members cost one model's forward pass (the
wider patch kernel and head aside).

Training gives each member its own image (`apply_members`, `[B, M, C, H, W]`), drawn by
`member_indices` from the batch; at test time every member reads the same image (`apply`,
`[B, C, H, W]`). The patch embedding is linear, so M copies of one image through the wide
kernel equal the image through the sum of its M channel blocks: `apply` computes that, at the
cost of a model with C input channels.

Weights: the network's, as its family names them (`patch/kernel` `[P, P, M C, D]`,
`classifier/kernel` `[D, M K]`, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from hydra_jax import checks
from hydra_jax.models.architectures import module_of, weight_count
from hydra_jax.models.outputs import ModelOutput
from hydra_jax.models.vit import ViTConfig


@dataclasses.dataclass(frozen=True)
class MimoConfig:
    """MIMO (Havasi et al., ICLR 2021): M members in one image classifier of `member`'s
    architecture, trained from scratch.

    The network is `member`'s with `M x C` input channels and `M x K` classes
    (`hydra_jax.models.mimo.network`): member m reads channels `m C .. (m + 1) C` (its own image
    in training) and owns logits `m K .. (m + 1) K`. At test time every member reads the same
    image. `member` is an image classifier (a ViT, DeiT or DINOv2 config with `num_labels`).
    """

    member: ViTConfig
    num_members: int

    def __post_init__(self) -> None:
        checks.count("num_members", self.num_members)
        if not isinstance(self.member, ViTConfig):
            raise TypeError(
                f"MIMO takes an image classifier (ViT, DeiT, DINOv2), "
                f"not {type(self.member).__name__}"
            )
        if self.member.num_labels < 1 or self.member.projection_dim:
            raise ValueError(
                "MIMO takes an image classifier: a member config with num_labels "
                "and no zero-shot projection"
            )


Params = Any
# The classifier weights of an image classifier (a DeiT with its teacher's head has two).
HEADS = ("classifier", "distillation_classifier")


def network(config: MimoConfig) -> ViTConfig:
    """The one network the members share: `M x C` input channels, `M x K` classes."""
    m, M = config.member, config.num_members
    return dataclasses.replace(m, num_channels=M * m.num_channels, num_labels=M * m.num_labels)


def _run(
    config: ViTConfig, params: Params, pixel_values: jax.Array, rng: jax.Array | None
) -> ModelOutput:
    rngs = None if rng is None else {"dropout": rng}
    return module_of(config).apply(
        {"params": params}, pixel_values, deterministic=rng is None, rngs=rngs
    )


def _member_logits(config: MimoConfig, out: ModelOutput) -> ModelOutput:
    """`logits` `[B, M K]` -> `[B, M, K]` (member m's are classes `m K .. (m + 1) K`); the
    members read the one network's features: `[B, F]` -> `[B, M, F]`."""
    B, M = out.logits.shape[0], config.num_members
    features = jnp.broadcast_to(out.features[:, None], (B, M, out.features.shape[-1]))
    return out.replace(logits=out.logits.reshape(B, M, config.member.num_labels), features=features)


def apply_members(
    config: MimoConfig, params: Params, pixel_values: jax.Array, rng: jax.Array | None = None
) -> ModelOutput:
    """Member m reads image `pixel_values[:, m]` (`[B, M, C, H, W]`): `logits` `[B, M, K]`; the
    hidden states are the one network's (`[B, T, D]`)."""
    expected = (config.num_members, config.member.num_channels)
    if pixel_values.ndim != 5 or pixel_values.shape[1:3] != expected:
        raise ValueError(
            f"pixel_values {pixel_values.shape}: expected [B, {expected[0]}, {expected[1]}, H, W]"
        )
    B, M, C, H, W = pixel_values.shape
    stacked = pixel_values.reshape(B, M * C, H, W)  # member m's channels: m C .. (m + 1) C
    return _member_logits(config, _run(network(config), params, stacked, rng))


def apply(
    config: MimoConfig, params: Params, inputs: dict[str, Any], rng: jax.Array | None
) -> ModelOutput:
    """Every member reads `inputs["pixel_values"]` (`[B, C, H, W]`): `logits` `[B, M, K]`.

    Computed as one model with C input channels whose patch kernel is the sum of the M channel
    blocks (equal to `apply_members` on M copies of the image, up to rounding)."""
    M, C = config.num_members, config.member.num_channels
    kernel = params["patch"]["kernel"]  # [P, P, M C, D]
    summed = kernel.reshape(*kernel.shape[:2], M, C, kernel.shape[-1]).sum(2)  # [P, P, C, D]
    params = {**params, "patch": {**params["patch"], "kernel": summed}}
    one_image = dataclasses.replace(network(config), num_channels=C)
    return _member_logits(config, _run(one_image, params, inputs["pixel_values"], rng))


def require(config: Any, what: str) -> MimoConfig:
    """`config`, refused unless it is MIMO's."""
    if not isinstance(config, MimoConfig):
        raise TypeError(f"{what} takes a MIMO model, not {type(config).__name__}")
    return config


def check_settings(repetitions: int, input_repetition: float, prefix: str = "") -> None:
    """Refuses MIMO training settings by name (`prefix`: where a config holds them)."""
    checks.count(f"{prefix}repetitions", repetitions)
    if not 0 <= input_repetition <= 1:
        raise ValueError(f"{prefix}input_repetition must lie in [0, 1], got {input_repetition}")


def member_indices(
    key: jax.Array,
    batch_size: int,
    num_members: int,
    repetitions: int = 1,
    input_repetition: float = 0.0,
) -> jax.Array:
    """Which example of a batch each member reads, `[M, R B]`, as MIMO trains.

    The batch is repeated `repetitions` (R) times and shuffled once; each member then shuffles
    the first `(1 - input_repetition)` share of that order on its own, so a share
    `input_repetition` of the rows show every member the same image (the paper's input
    repetition) and the rest pair independent images.
    """
    check_settings(repetitions, input_repetition)
    order_key, *member_keys = jax.random.split(key, num_members + 1)
    order = jax.random.permutation(order_key, jnp.tile(jnp.arange(batch_size), repetitions))
    shuffled = round(order.shape[0] * (1 - input_repetition))
    return jnp.stack(
        [
            jnp.concatenate([jax.random.permutation(k, order[:shuffled]), order[shuffled:]])
            for k in member_keys
        ]
    )


def parameter_count(config: MimoConfig, member: Params) -> int:
    """The weight count by its formula, from the weights `member` of one model of
    `config.member`: M - 1 more copies of the patch kernel and of each classifier's kernel and
    bias."""
    heads = [member[h] for h in HEADS if h in member]
    extra = weight_count(member["patch"]["kernel"]) + weight_count(heads)
    return weight_count(member) + (config.num_members - 1) * extra
