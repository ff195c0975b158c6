"""Head surgery: physically remove heads (a pure function returning a smaller model)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hydra_jax.models import (
    BertConfig,
    CLIPConfig,
    CLIPVisionTowerConfig,
    EncoderConfig,
    Model,
    ViTConfig,
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
        attention["out"] = {
            "kernel": to_host(attention["out"]["kernel"])[index],  # [n, K, D]
            "bias": attention["out"]["bias"],  # an emptied layer outputs this bias alone
        }
        layer["attention"] = attention
        layers[f"layer_{l}"] = layer
    counts = tuple(int(r.sum()) for r in rows)
    return layers, dataclasses.replace(encoder, num_heads=counts)


def compact(model: Model, keep: Keep | Mapping[str, Keep]) -> Model:
    """A smaller model without the heads where `keep` is False; outputs equal the masked model.

    Args:
      model: BERT, ViT, a CLIP vision tower, or CLIP.
      keep: bool `[L, N]` (or per-layer rows); for CLIP a mapping with optional `text` and
        `vision` entries.

    Returns:
      A `Model` whose layers may have different head counts (`config.encoder.num_heads`).
    """
    config, params = model.config, dict(model.params)
    if isinstance(config, BertConfig | ViTConfig | CLIPVisionTowerConfig):
        if isinstance(keep, Mapping):
            raise TypeError("keep must be an array for one encoder (a mapping is for CLIP models)")
        params["encoder"], encoder = compact_encoder(params["encoder"], config.encoder, keep)
        if isinstance(config, CLIPVisionTowerConfig):
            vision = dataclasses.replace(config.vision, encoder=encoder)
            return Model(dataclasses.replace(config, vision=vision), params)
        return Model(dataclasses.replace(config, encoder=encoder), params)
    if isinstance(config, CLIPConfig):
        if not isinstance(keep, Mapping) or not set(keep) <= {"text", "vision"}:
            raise TypeError("for CLIP, keep is a mapping with optional 'text'/'vision' entries")
        for tower, mask in keep.items():
            tower_config = getattr(config, tower)
            tower_params = dict(params[tower])
            tower_params["encoder"], encoder = compact_encoder(
                tower_params["encoder"], tower_config.encoder, mask
            )
            params[tower] = tower_params
            config = dataclasses.replace(
                config, **{tower: dataclasses.replace(tower_config, encoder=encoder)}
            )
        return Model(config, params)
    raise TypeError(f"cannot compact a {type(config).__name__}")


def expand_to_full(model: Model) -> Model:
    """The compacted model back at the full head count, removed heads' weights set to zero.

    HF configs cannot express per-layer head counts (and transformers 5 has no `prune_heads`),
    so this is how a compacted BERT/ViT is exported: a removed head contributes nothing because
    its output rows are zero, so outputs are unchanged.
    """
    config = model.config
    if not isinstance(config, BertConfig | ViTConfig):
        raise TypeError(f"expand_to_full takes BERT or ViT, not {type(config).__name__}")
    encoder = config.encoder
    full = encoder.width // encoder.head_dim
    layers = dict(model.params["encoder"])
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
    params = {**model.params, "encoder": layers}
    encoder = dataclasses.replace(encoder, num_heads=(full,) * encoder.num_layers)
    return Model(dataclasses.replace(config, encoder=encoder), params)
