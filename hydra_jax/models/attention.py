"""Multi-head attention with a real head axis and the head mask: the one pruning point."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hydra_jax.models.config import RelativeAttention
from hydra_jax.models.dense import Dense, as_rows, wide_dtype
from hydra_jax.models.dropout import Dropout
from hydra_jax.models.sharding import constrain

HEAD_MAJOR = ("batch", "heads", None, None)  # logical axes of q, k, v, contexts [B, N, T, K]


def padding_bias(
    attention_mask: jax.Array, dtype: jnp.dtype, causal: bool = False, queries: bool = False
) -> jax.Array:
    """Additive attention bias from a key padding mask.

    Masked logits get the dtype's most negative finite value, as `transformers` does, so a row
    with no valid key degrades to a uniform average instead of NaN.

    Args:
      attention_mask: `[B, S]`, 1 for real tokens and 0 for padding.
      dtype: the compute dtype; the bias is in the softmax dtype (`wide_dtype`).
      causal: also forbid each query from attending to later keys (CLIP text).
      queries: padding queries see no key either (DeBERTa): their logits are all the most
        negative value, so their rows attend uniformly, as in `transformers`.

    Returns:
      `[B, 1, T, S]` bias (T == S), 0 where attention is allowed.
    """
    allowed = attention_mask[:, None, None, :].astype(bool)  # [B, 1, 1, S]
    if causal:
        S = attention_mask.shape[-1]
        allowed = allowed & jnp.tril(jnp.ones((S, S), bool))[None, None]  # [B, 1, T, S]
    elif queries:
        allowed = allowed & attention_mask[:, None, :, None].astype(bool)  # [B, 1, T, S]
    else:
        allowed = jnp.broadcast_to(
            allowed, (*allowed.shape[:2], allowed.shape[-1], allowed.shape[-1])
        )
    dtype = wide_dtype(dtype)
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.finfo(dtype).min)


def window_bias(bias: jax.Array | None, T: int, window: int, dtype: jnp.dtype) -> jax.Array:
    """`bias` `[B, 1, T, S]` (or None: every key visible) with keys farther than `window`
    positions from the query masked too (a local attention layer); one mask, so a query that
    sees no key attends uniformly, as in `transformers`."""
    positions = np.arange(T)
    near = np.abs(positions[:, None] - positions[None, :]) <= window  # [T, S]
    dtype = wide_dtype(dtype)
    if bias is None:
        return jnp.where(near, jnp.zeros((), dtype), jnp.finfo(dtype).min)[None, None]
    return jnp.where(near[None, None], bias, jnp.finfo(bias.dtype).min)


def rotary(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of `x` `[B, N, T, K]` at positions 0..T-1 with base `theta`,
    computed in float32 as `transformers` does (each half of K rotated against the other)."""
    T, K = x.shape[-2:]
    inverse = 1.0 / (np.float32(theta) ** (np.arange(0, K, 2, dtype=np.float32) / np.float32(K)))
    angles = np.arange(T, dtype=np.float32)[:, None] * inverse.astype(np.float32)[None]  # [T, K/2]
    angles = np.concatenate([angles, angles], -1)  # [T, K]
    wide = x.astype(wide_dtype(x.dtype))
    half = K // 2
    turned = jnp.concatenate([-wide[..., half:], wide[..., :half]], -1)
    cos, sin = (jnp.asarray(f(angles), wide.dtype)[None, None] for f in (np.cos, np.sin))
    return (wide * cos + turned * sin).astype(x.dtype)


def log_buckets(distance: np.ndarray, buckets: int, max_distance: int) -> np.ndarray:
    """DeBERTa's bucketed distances: exact within `buckets // 2` of 0, logarithmic beyond, up to
    `max_distance`. float32 arithmetic, as `transformers` computes it (a bucket boundary is a
    float32 `ceil`)."""
    mid = buckets // 2
    sign = np.sign(distance)
    far = np.where((distance < mid) & (distance > -mid), mid - 1, np.abs(distance))
    ratio = np.log(far.astype(np.float32) / np.float32(mid))
    span = np.log(np.float32((max_distance - 1) / mid))
    log_distance = np.ceil(ratio / span * np.float32(mid - 1)) + np.float32(mid)
    return np.where(far <= mid, distance, log_distance * sign).astype(np.int64)


def relative_distances(T: int, relative: RelativeAttention) -> np.ndarray:
    """`[T, T]` int64: the (bucketed) distance `t - s` from query t to key s."""
    positions = np.arange(T)
    distance = positions[:, None] - positions[None, :]
    if relative.buckets > 0:
        distance = log_buckets(distance, relative.buckets, relative.max_distance)
    return distance


Drop = Callable[[jax.Array], jax.Array]  # dropout, or none


# Queries are attended in blocks of at most this many rows. XLA:CPU fuses the scores, softmax
# and value product into one kernel whose speed falls off a cliff past 256 rows (DINOv2-S at
# 224 px has 257 tokens). Rows are independent, so blocks give the same numbers
# (`bench/attention.py` times one DINOv2-S layer both ways).
QUERY_BLOCK = 256


def query_blocks(T: int, size: int = QUERY_BLOCK) -> list[tuple[int, int]]:
    """`[(start, stop), ...]`: T query rows in ceil(T / size) blocks of near-equal length."""
    count = max(1, -(-T // size))
    edges = [T * i // count for i in range(count + 1)]
    return list(itertools.pairwise(edges))


def rows(term: jax.Array, start: int, stop: int) -> jax.Array:
    """Query rows `start:stop` of a `[B, 1 | N, T | 1, S]` logit term (a broadcast row stays)."""
    return term if term.shape[2] == 1 else term[:, :, start:stop]


class Attention(nn.Module):
    """Self-attention whose per-head context is scaled by `head_mask` before the output projection.

    Attributes:
      num_heads: N (may be 0 after pruning: the output is then the output bias alone).
      head_dim: K.
      width: D.
      qkv_bias: whether query/key/value carry biases.
      dropout: dropout rate on the attention probabilities.
      dtype: compute dtype of the projections' operands (None: the parameters'). The softmax
        is float32 (float64 for float64 inputs) whatever it is.
      relative: DeBERTa's disentangled attention, or None. Logits then add content-to-position
        and position-to-content terms read from the distance embeddings, all divided by
        sqrt(K * `relative.scale_factor`).
      position_dropout: dropout rate on the distance embeddings (DeBERTa's hidden dropout).
      out_bias: whether the output projection carries a bias.
      rotary_theta: rotary position embedding of queries and keys with this base (0: none).
      out_dtype: the projections' outputs' dtype, hence that of queries, keys, values, the
        attention products' operands and the output (None: `dtype`).
    """

    num_heads: int
    head_dim: int
    width: int
    qkv_bias: bool = True
    dropout: float = 0.0
    dtype: jnp.dtype | None = None
    relative: RelativeAttention | None = None
    position_dropout: float = 0.0
    out_bias: bool = True
    rotary_theta: float = 0.0
    out_dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        bias: jax.Array | None,
        head_mask: jax.Array | None,
        deterministic: bool = True,
        distances: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """Attends.

        Args:
          x: `[B, T, D]`.
          bias: `[B, 1, T, S]` additive attention bias in the softmax dtype, or None (every key
            visible: images).
          head_mask: `[N]` floats or None (all heads kept); applied in the values' dtype.
          deterministic: disables attention dropout.
          distances: `[2A, D]` distance embeddings of the stack (with `relative` only).

        Returns:
          `([B, T, D] output, [B, N, T, S] attention probabilities in the softmax dtype)`.
        """
        N, K = self.num_heads, self.head_dim

        def projection(name: str) -> Dense:
            return Dense(
                (N, K), use_bias=self.qkv_bias, dtype=self.dtype, out_dtype=self.out_dtype,
                name=name,
            )  # fmt: skip

        # Head-major [B, N, T, K] operands make both attention products plain batched matmuls,
        # and scaling q (not the [B, N, T, S] scores) keeps XLA:CPU from materialising the scale
        # as a scores-sized operand. The softmax is normalised after the value product: the
        # division then touches [B, N, T, K] contexts, not [B, N, T, S] scores, and the
        # probabilities are only computed when a caller uses them (attention entropy). Dropout
        # commutes with the row division, so the dropout mask and its meaning are unchanged; the
        # context accumulates in the softmax dtype and returns to the values' dtype after the
        # division. `bench/attention.py` times this against normalising first.
        projections = {name: projection(name) for name in ("query", "key", "value")}
        B, T = x.shape[:2]
        q, k, v = (
            constrain(p(as_rows(x)).reshape(B, T, N, K).transpose(0, 2, 1, 3), HEAD_MAJOR)
            for p in projections.values()
        )
        if self.rotary_theta:
            q, k = rotary(q, self.rotary_theta), rotary(k, self.rotary_theta)
        divisor = K * (1 if self.relative is None else self.relative.scale_factor)
        q = q / jnp.sqrt(divisor).astype(q.dtype)  # q: [B, N, T, K]; k, v: [B, N, S, K]
        terms = [] if bias is None else [bias]  # additive [B, 1 | N, T, S] logit terms
        if self.relative is not None:
            if distances is None:
                raise ValueError("relative attention needs the stack's distance embeddings")
            terms.append(
                self._disentangled(q, k, distances, projections, projection, divisor, deterministic)
            )
        dropout = functools.partial(Dropout(self.dropout), deterministic=deterministic)
        blocks = [
            self._attend(q[:, :, a:b], k, v, [rows(t, a, b) for t in terms], dropout)
            for a, b in query_blocks(q.shape[2])
        ]
        context = jnp.concatenate([c for c, _ in blocks], axis=2)  # [B, N, T, K]
        probs = jnp.concatenate([p for _, p in blocks], axis=2)  # [B, N, T, S]
        context = constrain(context.astype(v.dtype), HEAD_MAJOR)
        context = context.transpose(0, 2, 1, 3)  # [B, T, N, K]
        if head_mask is not None:
            context = context * head_mask.astype(v.dtype)[None, None, :, None]
        output = Dense(
            self.width, axis=(-2, -1), use_bias=self.out_bias, dtype=self.dtype,
            out_dtype=self.out_dtype, name="out",
        )  # fmt: skip
        out = output(as_rows(context, 2)).reshape(B, T, self.width)  # [B, T, D]
        return out, probs

    @staticmethod
    def _attend(
        q: jax.Array, k: jax.Array, v: jax.Array, terms: list[jax.Array], dropout: Drop
    ) -> tuple[jax.Array, jax.Array]:
        """Queries `q` `[B, N, R, K]` (scaled; R of the T rows) against keys and values `[B, N,
        S, K]`, with additive logit terms `[B, 1 | N, R, S]` and `dropout` on the unnormalised
        probabilities: `(context [B, N, R, K] in the softmax dtype, probabilities [B, N, R, S])`."""
        wide_t = wide_dtype(q.dtype)
        logits = jnp.einsum("BNTK,BNSK->BNTS", q, k, preferred_element_type=wide_t)
        for term in terms:
            logits = logits + term
        peak = jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True))
        unnormalised = jnp.exp(logits - peak)  # [B, N, R, S]
        total = unnormalised.sum(axis=-1, keepdims=True)  # [B, N, R, 1]
        dropped = dropout(unnormalised)
        context = (
            jnp.einsum("BNTS,BNSK->BNTK", dropped.astype(v.dtype), v, preferred_element_type=wide_t)
            / total
        )
        return context, unnormalised / total

    def _disentangled(
        self,
        q: jax.Array,
        k: jax.Array,
        distances: jax.Array,
        projections: dict[str, nn.Module],
        projection: Callable[[str], nn.Module],
        divisor: int,
        deterministic: bool,
    ) -> jax.Array:
        """DeBERTa's position terms `[B, N, T, S]` of the logits, for scaled queries `q`
        `[B, N, T, K]` and keys `k` `[B, N, S, K]` (T == S: self-attention).

        c2p[t, s] = q_t . Kp[c2p(t, s)] and p2c[t, s] = k_s . Qp[p2c(s, t)], where Kp, Qp
        `[2A, N, K]` are the distance embeddings projected by the layer's key and query
        projections (or its own `pos_key`, `pos_query`), c2p(t, s) = clip(d(t, s) + A) and
        p2c(s, t) = clip(A - d(s, t)) index them, d the bucketed distance, clip to [0, 2A).
        """
        r, T = self.relative, q.shape[2]
        distance = relative_distances(T, r)  # [T, S]
        c2p_index = np.clip(distance + r.span, 0, 2 * r.span - 1)  # [T, S]
        p2c_index = np.clip(r.span - distance, 0, 2 * r.span - 1)  # [S, T]
        # Only the rows these T tokens index are projected (at most 2T - 1 of the 2A): the same
        # values, a fraction of the work when T < A (64 tokens of DeBERTa-v3's 256 buckets).
        low = int(min(c2p_index.min(), p2c_index.min()))
        high = int(max(c2p_index.max(), p2c_index.max()))
        table = Dropout(self.position_dropout, name="position_dropout")(
            distances[low : high + 1], deterministic=deterministic
        )  # [R, D]
        if not r.share_keys:
            projections = {
                "key": projection("pos_key") if r.c2p else None,
                "query": projection("pos_query") if r.p2c else None,
            }
        rows = np.arange(T)[:, None]
        wide_t = wide_dtype(q.dtype)
        terms = jnp.zeros((), wide_t)
        if r.c2p:
            keys = projections["key"](table)  # [R, N, K]
            scores = jnp.einsum("BNTK,RNK->BNTR", q, keys, preferred_element_type=wide_t)
            terms = terms + scores[:, :, rows, c2p_index - low]
        if r.p2c:
            queries = projections["query"](table)  # [R, N, K]
            queries = queries / jnp.sqrt(divisor).astype(queries.dtype)
            scores = jnp.einsum("BNSK,RNK->BNSR", k, queries, preferred_element_type=wide_t)
            terms = terms + scores[:, :, rows, p2c_index - low].swapaxes(-1, -2)  # [B, N, T, S]
        return terms
