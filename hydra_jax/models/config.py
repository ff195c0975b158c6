"""What every family's frozen configuration shares: the layer stack (`EncoderConfig`), DeBERTa's
relative attention and the compute dtype. A family's own config lives with its model
(`bert.BertConfig`, `vit.ViTConfig`, ...), an ensemble kind's with its module
(`fused.HydraConfig`, `efficient.BatchEnsembleConfig`, ...); `hydra_jax.models` exports them
all."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hydra_jax.models.kinds import ArchConfig

COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RelativeAttention:
    """DeBERTa's disentangled attention: attention logits also read learned embeddings of the
    relative distance between query and key, content-to-position (`c2p`: the query against the
    key's distance embedding) and position-to-content (`p2c`: the key against the query's).

    The distance embeddings `[2A, D]` (A = `span`) belong to the whole stack (`rel_embeddings`,
    optionally LayerNormed: `norm`); each layer projects them with its own key / query
    projections (`share_keys`) or with separate `pos_key` / `pos_query` projections.

    Attributes:
      span: A, the distances embedded on each side: `buckets` if > 0, else `max_distance`.
      buckets: log-bucketing of distances beyond `buckets // 2` (0: exact distances, clipped).
      max_distance: the largest distance the log buckets reach (`max_relative_positions`).
      c2p: content-to-position logits.
      p2c: position-to-content logits.
      share_keys: positions projected by the layer's own key and query projections.
      norm: a LayerNorm (`rel_norm`) on the distance embeddings.
    """

    span: int
    buckets: int
    max_distance: int
    c2p: bool = True
    p2c: bool = True
    share_keys: bool = True
    norm: bool = True

    @property
    def scale_factor(self) -> int:
        """Logits are divided by sqrt(K * this): one term each for content, c2p and p2c."""
        return 1 + int(self.c2p) + int(self.p2c)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """The transformer layer stack shared by BERT, ViT and both CLIP towers.

    Attributes:
      num_heads: heads per layer, length L. Equal in a checkpoint; may differ after `compact`.
      width: D, the residual stream width.
      head_dim: K; kept when heads are removed, so `width == N * K` holds only before pruning.
      mlp_dim: F.
      activation: a key of `hydra_jax.models.layers.ACTIVATIONS` (HF `hidden_act` names).
      layer_norm_eps: epsilon of every LayerNorm, taken from the checkpoint.
      pre_norm: True for ViT/CLIP (LN before each block), False for BERT (LN after the residual).
      causal: True for the CLIP text tower.
      qkv_bias: whether query/key/value projections carry biases.
      dropout: residual and embedding dropout rate (used only when a dropout RNG is given).
      attention_dropout: dropout rate on attention probabilities.
      layer_scale: per-channel learned scales `[D]` on each block's output before the residual
        sum (`attention_scale`, `mlp_scale`; DINOv2's LayerScale).
      dtype: the compute dtype, "float32" or "bfloat16" (`COMPUTE_DTYPES`): that of the
        operands of the encoder layers' dense products (attention projections, MLP), which
        accumulate in float32. Parameters stay in their own dtype (float32); attention softmax,
        LayerNorm statistics, logits, embeddings and losses are float32 whatever it is.
      hidden_dtype: the dtype of everything else: hidden states, the dense layers' outputs,
        the attention products, embedding tables and heads. "float32" (the default): only the
        dense products' operands take `dtype`; or `dtype` itself: everything does, as Flax's
        `dtype=` means (half the activation memory; on a CPU, conversions around every
        element-wise operation).
      relative: DeBERTa's disentangled attention, or None (positions enter only as embeddings).
      out_bias: whether the attention output projection carries a bias.
      mlp_bias: whether the MLP's dense layers carry biases.
      norm_bias: whether the LayerNorms carry biases (ModernBERT: none of the three).
      gated_mlp: GLU MLP (ModernBERT's GeGLU): `fc1` `[D, 2F]` gives an input and a gate, the
        output is `fc2(activation(input) * gate)`.
      rotary: per layer, the RoPE base theta of its queries and keys (ModernBERT: global and
        local layers differ); empty for none.
      windows: per layer, the largest |query - key| distance it attends over (ModernBERT's
        local layers: half the local window), 0 for global attention; empty for all global.
      first_norm: layer 0 normalises its attention input (ModernBERT's does not: its embedding
        stage ends in a norm).
      remat: rematerialise each layer in the backward pass (`jax.checkpoint`): a gradient keeps
        only every layer's input, not its intermediates, and recomputes the layer's forward
        from it (about a third more FLOPs for a fraction of the activation memory). The
        values are the same program's up to the order XLA fuses the recomputation in.
    """

    num_heads: tuple[int, ...]
    width: int
    head_dim: int
    mlp_dim: int
    activation: str
    layer_norm_eps: float
    pre_norm: bool
    causal: bool = False
    qkv_bias: bool = True
    dropout: float = 0.0
    attention_dropout: float = 0.0
    dtype: str = "float32"
    hidden_dtype: str = "float32"
    layer_scale: bool = False
    relative: RelativeAttention | None = None
    out_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    gated_mlp: bool = False
    rotary: tuple[float, ...] = ()
    windows: tuple[int, ...] = ()
    first_norm: bool = True
    remat: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute dtype {self.dtype!r} is not one of {COMPUTE_DTYPES}")
        if self.hidden_dtype not in ("float32", self.dtype):
            raise ValueError(
                f"hidden dtype {self.hidden_dtype!r} is neither float32 nor the compute dtype "
                f"{self.dtype!r}"
            )
        for name in ("rotary", "windows"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.num_heads):
                raise ValueError(f"{name} needs one entry per layer ({len(self.num_heads)})")
        if self.rotary and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")
        if self.layer_scale and not self.pre_norm:
            raise ValueError("layer scale is modelled for pre-LN stacks only")

    @property
    def num_layers(self) -> int:
        return len(self.num_heads)


def member_of(config: Any) -> Any:
    """The members' architecture of an ensemble config (one holding `member` and
    `num_members`), else None: `config` is one model's."""
    return getattr(config, "member", None) if hasattr(config, "num_members") else None


def with_encoders(config: ArchConfig, **changes: Any) -> ArchConfig:
    """`config` with `changes` to the fields of every encoder it holds (both towers of a dual
    encoder, a Hydra's member); nothing else changes."""
    if isinstance(config, EncoderConfig):
        return dataclasses.replace(config, **changes)
    inner = {
        f.name: with_encoders(value, **changes)
        for f in dataclasses.fields(config)
        if dataclasses.is_dataclass(value := getattr(config, f.name))
    }
    return dataclasses.replace(config, **inner)


def with_compute_dtype(config: ArchConfig, dtype: str, hidden: str = "float32") -> ArchConfig:
    """`config` with every encoder computing in `dtype`, its hidden states in `hidden`."""
    return with_encoders(config, dtype=dtype, hidden_dtype=hidden)
