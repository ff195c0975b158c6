"""The checks a batch passes outside `jit` (shapes always; values where they are known) before
any computation: token ids, pixels and head masks. Which checks a family runs is its entry in
the architecture table (`architectures.py`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from hydra_jax.models.config import EncoderConfig

if TYPE_CHECKING:
    from hydra_jax.models.bert import BertConfig


def check_head_mask(mask: Any, encoder: EncoderConfig, name: str = "head_mask") -> None:
    """Raises ValueError unless `mask` is `[L, N]` (or L arrays `[N_l]` for unequal layers)."""
    counts = encoder.num_heads
    if len(set(counts)) == 1:
        expected = f"shape {(len(counts), counts[0])}"
    else:
        expected = f"a sequence of {len(counts)} arrays of shapes {[(n,) for n in counts]}"
    if isinstance(mask, Sequence) and not hasattr(mask, "shape"):
        shapes = [tuple(np.shape(m)) for m in mask]
    else:
        shape = tuple(np.shape(mask))
        shapes = [shape[1:]] * shape[0] if len(shape) == 2 else None
    if shapes != [(n,) for n in counts]:
        got = np.shape(mask) if hasattr(mask, "shape") else shapes
        raise ValueError(
            f"{name} has shape {got}, but this model has {len(counts)} layers with "
            f"{list(counts)} heads: expected {expected}"
        )


def concrete(x: Any) -> np.ndarray | None:
    """`x` as numpy when its values are known (None under `jit`/`grad` tracing)."""
    return None if x is None or isinstance(x, jax.core.Tracer) else np.asarray(x)


def _check_ids(name: str, ids: Any, high: int, what: str) -> None:
    values = concrete(ids)
    if values is None or values.size == 0:
        return
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {values.dtype}")
    bad = np.nonzero((values < 0) | (values >= high))
    if bad[0].size:
        where = tuple(int(i[0]) for i in bad)
        raise ValueError(
            f"{name} must lie in [0, {high}) ({what}); {bad[0].size} do not, e.g. "
            f"{int(values[where])} at {where}"
        )


def check_text(inputs: Mapping[str, Any], vocab: int, positions: int, types: int | None) -> None:
    """`positions`: the most tokens the position table serves; `types`: token types (None:
    not checked)."""
    ids = inputs.get("input_ids")
    if ids is None:
        return
    shape = tuple(np.shape(ids))
    if len(shape) != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {shape}")
    if shape[1] == 0:
        raise ValueError(f"input_ids has no tokens (shape {shape}): every example needs one")
    if shape[1] > positions:
        raise ValueError(
            f"input_ids has {shape[1]} tokens, more than the model's {positions} positions"
        )
    for name in ("attention_mask", "token_type_ids"):
        if inputs.get(name) is not None and tuple(np.shape(inputs[name])) != shape:
            raise ValueError(
                f"{name} has shape {tuple(np.shape(inputs[name]))}, input_ids has {shape}"
            )
    _check_ids("input_ids", ids, vocab, "the vocabulary")
    if types is not None and inputs.get("token_type_ids") is not None:
        # A model without token types (DistilBERT) takes the zeros a batch carries, no more.
        what = "the token types" if types else "this model has no token types: all 0"
        _check_ids("token_type_ids", inputs["token_type_ids"], max(types, 1), what)


def token_types(config: BertConfig) -> int | None:
    """The token types a BERT-family model takes; None where any are ignored, as
    `transformers` ignores them (DeBERTa without token types: its tokenizer marks the second
    text of a pair with 1s)."""
    if config.variant.disentangled and not config.type_vocab_size:
        return None
    return config.type_vocab_size


def check_pixels(pixels: Any, image_size: int, channels: int, any_size: int = 0) -> None:
    """`any_size`: a patch size P; images of any size of at least P x P pass (DINOv2 resizes
    its positions), else exactly `image_size`."""
    if pixels is None:
        return
    dtype = np.dtype(pixels.dtype if hasattr(pixels, "dtype") else np.asarray(pixels).dtype)
    if not jnp.issubdtype(dtype, jnp.floating):  # (bfloat16 is a floating type to JAX)
        raise ValueError(
            f"pixel_values are {dtype} (raw image values?); the model takes the normalised floats "
            "of its image processor: transformers.AutoImageProcessor.from_pretrained(DIR)(images)"
            " or hydra_jax.data.files.pixels"
        )
    values = concrete(pixels)
    if values is not None and not np.all(np.isfinite(values)):
        raise ValueError("pixel_values contain NaN/inf")
    shape = tuple(np.shape(pixels))
    expected = (channels, image_size, image_size)
    if len(shape) == 4 and shape[1:] == expected:
        return
    if any_size and len(shape) == 4 and shape[1] == channels and min(shape[2:]) >= any_size:
        return
    if len(shape) == 4 and shape[1:] == (image_size, image_size, channels):
        raise ValueError(
            f"pixel_values has shape {shape}: channels last (NHWC); this model takes [B, C, H, W]"
            f" = [B, {channels}, {image_size}, {image_size}] (transpose with (0, 3, 1, 2))"
        )
    raise ValueError(
        f"pixel_values has shape {shape}; this model takes [B, C, H, W] = "
        f"[B, {channels}, {image_size}, {image_size}]"
    )
