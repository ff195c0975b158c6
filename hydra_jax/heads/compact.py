"""Head surgery: physically remove heads (a pure function returning a smaller model)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hydra_jax.models import EncoderConfig, Model
from hydra_jax.models.architectures import (
    architecture,
    single_tower,
    tower_encoder,
    tower_params,
    with_tower_encoder,
    with_tower_params,
)
from hydra_jax.models.sharding import to_host

Keep = np.ndarray | Sequence[np.ndarray]  # bool [L, N], or L bool [N_l] for unequal layers


def _layer_keeps(keep: Keep, encoder: EncoderConfig) -> list[np.ndarray]:
    raw = [np.asarray(k) for k in keep]
    if any(r.dtype != bool and not np.isin(r, (0, 1)).all() for r in raw):
        raise ValueError(
            "keep mask must be boolean (or 0/1), one entry per head; got other values "
            "(scores? `heads.keep_mask(scores, ratio=...)` turns scores into a mask)"
        )
    rows = [r.astype(bool) for r in raw]
    if [r.shape for r in rows] != [(n,) for n in encoder.num_heads]:
        raise ValueError(
            f"keep mask has shapes {[r.shape for r in rows]}, but the encoder has "
            f"{list(encoder.num_heads)} heads per layer"
        )
    return rows


def compact_encoder(
    params: Mapping[str, Any], encoder: EncoderConfig, keep: Keep
) -> tuple[dict[str, Any], EncoderConfig]:
    """Slices every layer's per-head projection columns `[D, N, K]` (query, key, value, and
    DeBERTa's `pos_key`, `pos_query` where it has them) and output rows `[N, K, D]` to kept heads.

    Reads the weights on the host, gathered first where a mesh splits them over processes.
    """
    rows = _layer_keeps(keep, encoder)
    layers = dict(params)
    for l, row in enumerate(rows):
        index = np.nonzero(row)[0]
        layer = dict(layers[f"layer_{l}"])
        attention = dict(layer["attention"])
        for name in sorted(set(attention) - {"out"}):
            projection = {"kernel": to_host(attention[name]["kernel"])[:, index]}  # [D, n, K]
            if "bias" in attention[name]:
                projection["bias"] = to_host(attention[name]["bias"])[index]  # [n, K]
            attention[name] = projection
        # An emptied layer outputs the output bias alone (zeros where there is none).
        out = {"kernel": to_host(attention["out"]["kernel"])[index]}  # [n, K, D]
        attention["out"] = {**attention["out"], **out}
        layer["attention"] = attention
        layers[f"layer_{l}"] = layer
    counts = tuple(int(r.sum()) for r in rows)
    return layers, dataclasses.replace(encoder, num_heads=counts)


def compact(model: Model, keep: Keep | Mapping[str, Keep]) -> Model:
    """A smaller model without the heads where `keep` is False; outputs equal the masked model.

    Args:
      model: any architecture of the table: a single-encoder model (BERT family, ViT family, a
        CLIP vision tower) or a two-tower one (CLIP, a dual encoder).
      keep: bool `[L, N]` (or per-layer rows); for two towers a mapping with optional `text`
        and `vision` entries.

    Returns:
      A `Model` whose layers may have different head counts (`config.encoder.num_heads`).
    """
    config, params = model.config, model.params
    towers = architecture(config).towers
    if single_tower(config) is not None:
        if isinstance(keep, Mapping):
            raise TypeError("keep must be an array for one encoder (a mapping is for two towers)")
        keeps = {"": keep}
    elif not isinstance(keep, Mapping) or not set(keep) <= set(towers):
        raise TypeError(
            f"for a {type(config).__name__}, keep is a mapping with optional entries "
            f"{sorted(towers)}"
        )
    else:
        keeps = dict(keep)
    for name, mask in keeps.items():
        tower = towers[name]
        layers, encoder = compact_encoder(
            tower_params(params, tower)["encoder"], tower_encoder(config, tower), mask
        )
        weights = {**tower_params(params, tower), "encoder": layers}
        params = with_tower_params(params, tower.params, weights)
        config = with_tower_encoder(config, tower.config, encoder)
    return Model(config, params)


def expand_to_full(model: Model) -> Model:
    """The compacted model back at the full head count, removed heads' weights set to zero.

    HF configs cannot express per-layer head counts (and transformers 5 has no `prune_heads`),
    so this is how a compacted model is exported: a removed head contributes nothing because
    its output rows are zero, so outputs are unchanged.
    """
    config = model.config
    tower = single_tower(config)
    if tower is None:
        raise TypeError(f"expand_to_full takes a single-encoder model, not {type(config).__name__}")
    encoder = tower_encoder(config, tower)
    full = encoder.width // encoder.head_dim
    weights = tower_params(model.params, tower)
    layers = dict(weights["encoder"])
    for l, n in enumerate(encoder.num_heads):
        attention = dict(layers[f"layer_{l}"]["attention"])
        for name in attention:
            leaf = dict(attention[name])
            axis = 1 if name != "out" else 0
            kernel = np.asarray(leaf["kernel"])
            pad = [(0, 0)] * kernel.ndim
            pad[axis] = (0, full - n)
            leaf["kernel"] = np.pad(kernel, pad)
            if name != "out" and "bias" in leaf:
                leaf["bias"] = np.pad(np.asarray(leaf["bias"]), [(0, full - n), (0, 0)])
            attention[name] = leaf
        layers[f"layer_{l}"] = {**layers[f"layer_{l}"], "attention": attention}
    params = with_tower_params(model.params, tower.params, {**weights, "encoder": layers})
    encoder = dataclasses.replace(encoder, num_heads=(full,) * encoder.num_layers)
    return Model(with_tower_encoder(config, tower.config, encoder), params)
