"""Head importance scores `[L, N]`: gradient of the head mask, attention entropy, HIES, baselines.

| method           | score of head (l, h)                                                  |
|------------------|-----------------------------------------------------------------------|
| `taylor` / `his` | `E_x |dL(x)/dm_{l,h}|` at m = 1, absolute value per example           |
| `entropy`        | AE: mean over examples of the mean over valid query rows of           |
|                  | `H(attn_t) / log(n_valid_t)`, in [0, 1]                               |
| `hies`           | `alpha * minmax(HIS) + (1 - alpha) * (1 - minmax(AE))` (HIES paper)   |
| `ad`             | `1 - AE` (the HIES paper's attention-entropy baseline)                |
| `l2`             | L2 norm of the head's query/key/value columns and output rows         |
| `random`         | seeded uniform                                                        |

HIS and AE come from the same pass: one forward+backward per calibration batch, with the
per-example gradient taken by `vmap(grad)`. Without labels the loss is taken on the model's own
argmax prediction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import xlogy

from hydra_jax import metrics
from hydra_jax.models import Model, check_inputs, encoder_of, input_names
from hydra_jax.models.kinds import ArchConfig
from hydra_jax.models.sharding import (
    example_vmap,
    overlapped,
    place_batch,
    place_params,
    rows_out,
)

METHODS = ("taylor", "his", "entropy", "hies", "ad", "l2", "random")
Batch = dict[str, Any]


def attention_entropy(
    attentions: jax.Array, attention_mask: jax.Array, causal: bool = False
) -> jax.Array:
    """Length-normalised attention entropy per example and head.

    Args:
      attentions: `[L, B, N, T, S]` probabilities.
      attention_mask: `[B, S]`, 1 for real tokens.
      causal: query t sees keys 0..t only (CLIP text).

    Returns:
      `[B, L, N]`: for each valid query row t, `H(attn_t) / log(n_t)` with n_t its number of
      visible keys (0 where n_t = 1), averaged over valid rows. Never the entropy of an
      averaged map.
    """
    mask = attention_mask.astype(attentions.dtype)  # [B, S]
    T = mask.shape[-1]
    visible = jnp.broadcast_to(mask[:, None, :], (mask.shape[0], T, T))  # [B, T, S]
    if causal:
        visible = visible * jnp.tril(jnp.ones((T, T), mask.dtype))[None]
    n = visible.sum(-1)  # [B, T]
    log_n = jnp.where(n > 1, jnp.log(jnp.maximum(n, 2.0)), 1.0)
    h = -xlogy(attentions, attentions).sum(-1)  # [L, B, N, T]
    h = jnp.where(n > 1, 1.0, 0.0)[None, :, None, :] * h / log_n[None, :, None, :]
    rows = mask[None, :, None, :]  # valid query rows
    per_example = (h * rows).sum(-1) / rows.sum(-1)  # [L, B, N]
    return jnp.transpose(per_example, (1, 0, 2))


@functools.lru_cache(maxsize=32)
def _head_stats(config: ArchConfig, use_labels: bool):
    """`(params, batch) -> (|grad| [B, L, N], entropy [B, L, N])`, one forward+backward.

    Compiled once per architecture (configs are frozen, so hashable): Hydra-Taylor scores M
    calibration subsets and pruning curves score repeatedly, all with one program.
    """
    model = Model(config, None)  # the architecture; weights arrive as an argument
    encoder = encoder_of(config)
    L, N = encoder.num_layers, encoder.num_heads[0]
    names = set(input_names(model.config))

    def one(params: Any, example: Batch) -> tuple[jax.Array, jax.Array]:
        inputs = {k: v[None] for k, v in example.items() if k in names}  # batch of one

        def loss(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
            out = model.apply(params, **inputs, head_mask=mask, output_attentions=True)
            log_p = jax.nn.log_softmax(out.logits[0])  # [C]
            target = example["labels"] if use_labels else jax.lax.stop_gradient(log_p.argmax())
            S = out.attentions.shape[-1]
            # The key padding comes from the model's own inputs: none for images.
            keys = inputs.get("attention_mask", jnp.ones((1, S), jnp.int32))
            entropy = attention_entropy(out.attentions, keys, encoder.causal)[0]
            return -log_p[target], entropy

        dtype = jax.tree.leaves(params)[0].dtype  # float64 weights give float64 gradients
        grad, entropy = jax.grad(loss, has_aux=True)(jnp.ones((L, N), dtype))
        return jnp.abs(grad), entropy

    return jax.jit(rows_out(example_vmap(one, in_axes=(None, 0))))  # outputs split as rows


def his_and_entropy(
    model: Model, batches: Iterable[Batch], use_labels: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """HIS `E_x |dL/dm|` and AE, both `[L, N]`, over every example of `batches`.

    Args:
      model: a classifier with one encoder (BERT, ViT, CLIP vision tower with a zero-shot head).
      batches: model-input dicts, with `labels` `[B]` when `use_labels`.
      use_labels: the loss on the labels (else on the model's own argmax).
    """
    if getattr(model.config, "num_labels", 0) == 0:
        raise ValueError("gradient and entropy scores need a model with a classifier")
    if len(set(encoder_of(model.config).num_heads)) != 1:
        raise ValueError("score a model before compacting it (layers have unequal head counts)")
    stats = _head_stats(model.config, use_labels)
    params = place_params(model.params)  # on the current mesh, if any
    num_labels = model.config.num_labels

    def dispatch(numbered: tuple[int, Batch]) -> tuple[jax.Array, jax.Array]:
        index, batch = numbered
        if use_labels:  # out-of-range classes would pass through JAX's gather unnoticed
            if "labels" not in batch:
                raise ValueError("use_labels=True needs `labels` in every calibration batch")
            size = len(next(v for k, v in batch.items() if k != "labels"))
            try:
                metrics.check_labels(batch["labels"], size, num_labels)
            except ValueError as error:
                raise ValueError(f"calibration batch {index}: {error}") from None
        if not use_labels:
            batch = {k: v for k, v in batch.items() if k != "labels"}
        check_inputs(model.config, batch)
        return stats(params, place_batch(batch))

    grad_sum = entropy_sum = 0.0
    count = 0
    for _, (grads, entropy) in overlapped(enumerate(batches), dispatch):  # sums in float64
        grad_sum = grad_sum + grads.astype(np.float64).sum(0)
        entropy_sum = entropy_sum + entropy.astype(np.float64).sum(0)
        count += grads.shape[0]
    if count == 0:
        raise ValueError("no calibration examples: batches was empty")
    return grad_sum / count, entropy_sum / count


def minmax(x: np.ndarray) -> np.ndarray:
    """Global min-max to [0, 1] (all zeros if constant)."""
    x = np.asarray(x, np.float64)
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)


def hies(his: np.ndarray, entropy: np.ndarray, alpha: float) -> np.ndarray:
    """`alpha * minmax(HIS) + (1 - alpha) * (1 - minmax(AE))`: high = important."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    his, entropy = np.asarray(his, np.float64), np.asarray(entropy, np.float64)
    if his.ndim != 2 or his.shape != entropy.shape:
        raise ValueError(
            f"his and entropy must both be [L, N], got shapes {his.shape} and {entropy.shape}"
        )
    if not (np.isfinite(his).all() and np.isfinite(entropy).all()):
        raise ValueError("his or entropy contains NaN/inf")
    return alpha * minmax(his) + (1 - alpha) * (1 - minmax(entropy))


def l2_scores(model: Model) -> np.ndarray:
    """`[L, N]` L2 norm of each head's query/key/value kernel columns and output kernel rows."""
    encoder = encoder_of(model.config)
    rows = []
    for l in range(encoder.num_layers):
        attention = model.params["encoder"][f"layer_{l}"]["attention"]
        squares = sum(
            np.square(np.asarray(attention[name]["kernel"])).sum(axis=(0, 2))  # [D, N, K] -> [N]
            for name in ("query", "key", "value")
        ) + np.square(np.asarray(attention["out"]["kernel"])).sum(axis=(1, 2))  # [N, K, D] -> [N]
        rows.append(np.sqrt(squares))
    return np.stack(rows)


def score(
    model: Model,
    batches: Iterable[Batch] | None = None,
    method: str = "hies",
    *,
    alpha: float = 0.5,
    seed: int = 0,
    use_labels: bool = True,
    layer_normalize: bool = False,
    global_minmax: bool = False,
) -> np.ndarray:
    """Head importance `[L, N]` (higher = more important, pruned last).

    Args:
      model: a classifier of any family (text, image, or a dual encoder's vision tower with a
        zero-shot head), a fused Hydra's member excluded (gradient and entropy scores need
        logits; `l2` and `random` need none).
      batches: calibration batches (model-input dicts with `labels`); unused by `l2` and
        `random`.
      method: one of `taylor`, `his`, `entropy`, `hies`, `ad`, `l2`, `random`.
      alpha: the HIES mixing weight.
      seed: for `random`.
      use_labels: HIS/Taylor loss on the labels (else on the model's argmax).
      layer_normalize: divide each layer's scores by their L2 norm (Michel et al., 2019).
      global_minmax: finally min-max the scores over all heads.

    Note: `entropy` returns AE itself, where HIGH entropy is what HIES prunes FIRST; use `ad`
    (1 - AE) to rank heads by entropy as an importance.
    """
    if method not in METHODS:
        raise ValueError(f"unknown scoring method {method!r}; choose from {METHODS}")
    encoder = encoder_of(model.config)
    if method == "random":
        s = np.random.default_rng(seed).uniform(size=(encoder.num_layers, encoder.num_heads[0]))
    elif method == "l2":
        s = l2_scores(model)
    else:
        if batches is None:
            raise ValueError(f"method {method!r} needs calibration batches")
        his, entropy = his_and_entropy(model, batches, use_labels)
        s = {
            "taylor": his,
            "his": his,
            "entropy": entropy,
            "ad": 1 - entropy,
            "hies": hies(his, entropy, alpha) if method == "hies" else None,
        }[method]
    if layer_normalize:
        norms = np.linalg.norm(s, axis=1, keepdims=True)
        s = s / np.where(norms > 0, norms, 1.0)
    return minmax(s) if global_minmax else np.asarray(s, np.float64)
