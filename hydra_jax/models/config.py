"""Frozen model configurations, built by the checkpoint converters or by test presets."""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra_jax import checks

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
      dtype: the compute dtype, "float32" or "bfloat16" (`COMPUTE_DTYPES`). Parameters stay in
        their own dtype (float32); matmuls and hidden states run in `dtype`; attention softmax,
        LayerNorm statistics, logits, embeddings and losses are float32 whatever it is.
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
    layer_scale: bool = False
    relative: RelativeAttention | None = None
    out_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    gated_mlp: bool = False
    rotary: tuple[float, ...] = ()
    windows: tuple[int, ...] = ()
    first_norm: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute dtype {self.dtype!r} is not one of {COMPUTE_DTYPES}")
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


@dataclasses.dataclass(frozen=True)
class TextVariant:
    """How a BERT-family checkpoint differs from BERT itself (its encoder layers do not).

    Attributes:
      positions_after_padding: position ids count the real tokens of each row, starting at
        `pad_token_id + 1` (RoBERTa); else 0..T-1.
      head: the sequence classifier on the first token's final state: `pooler` (BERT: the tanh
        pooler, dropout, a dense layer), `tanh` / `gelu` (RoBERTa / ELECTRA / DeBERTa: dropout,
        a dense layer, the activation, dropout, a dense layer), `relu` (DistilBERT: a dense
        layer, ReLU, dropout, a dense layer).
      disentangled: DeBERTa's embedding stage: the tables' sum projected (no bias) to the
        encoder's width before its LayerNorm, padding tokens' embeddings zeroed, and padding
        queries masked as well as padding keys (their rows attend uniformly).
    """

    positions_after_padding: bool
    head: str
    disentangled: bool = False


# HF `model_type` -> how it differs from BERT. XLM-RoBERTa and CamemBERT are RoBERTa networks.
TEXT_VARIANTS = {
    "bert": TextVariant(positions_after_padding=False, head="pooler"),
    "roberta": TextVariant(positions_after_padding=True, head="tanh"),
    "xlm-roberta": TextVariant(positions_after_padding=True, head="tanh"),
    "camembert": TextVariant(positions_after_padding=True, head="tanh"),
    "electra": TextVariant(positions_after_padding=False, head="gelu"),
    "distilbert": TextVariant(positions_after_padding=False, head="relu"),
    "deberta-v2": TextVariant(positions_after_padding=False, head="gelu", disentangled=True),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """A BERT-family encoder (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT,
    DeBERTa-v2/v3: one post-LN layer stack, `model_type` names the variant); `num_labels == 0`
    means no sequence classifier.

    Attributes:
      type_vocab_size: token types; 0 for none (DistilBERT: no `token_type_ids` input).
      embedding_size: the width of the token tables when it differs from the encoder's,
        projected to it (`embeddings_project`: ELECTRA's, or DeBERTa's without a bias); 0 for
        the encoder's width.
      absolute_positions: a table of absolute positions added to the token embeddings (DeBERTa
        can go without: `position_biased_input`; its attention then sees only distances).
      pre_classifier_dropout: a two-layer head's dropout before its first dense layer (DeBERTa's
        `pooler_dropout`); None for `classifier_dropout`.
    """

    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    type_vocab_size: int
    pad_token_id: int = 0
    pooler: bool = True
    num_labels: int = 0
    classifier_dropout: float | None = None
    model_type: str = "bert"
    embedding_size: int = 0
    absolute_positions: bool = True
    pre_classifier_dropout: float | None = None

    def __post_init__(self) -> None:
        if self.model_type not in TEXT_VARIANTS:
            raise ValueError(
                f"model_type {self.model_type!r} is not one of {sorted(TEXT_VARIANTS)}"
            )
        if (self.encoder.relative is not None) != self.variant.disentangled:
            raise ValueError(
                f"a {self.model_type} encoder {'needs' if self.variant.disentangled else 'has no'}"
                " relative (disentangled) attention"
            )

    @property
    def variant(self) -> TextVariant:
        return TEXT_VARIANTS[self.model_type]

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table serves."""
        offset = self.pad_token_id + 1 if self.variant.positions_after_padding else 0
        return self.max_positions - offset


POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """A ModernBERT encoder; `num_labels == 0` means no sequence classifier.

    Attributes:
      max_positions: the longest sequence (`max_position_embeddings`; rotary positions have no
        table, this is the length the checkpoint was trained for).
      pooling: what the classifier reads, `cls` (the first token) or `mean` (the mean over real
        tokens), after the final norm.
      head_bias: whether the head's dense layer carries a bias (`classifier_bias`).
      head_activation: the head's activation (`classifier_activation`).
      classifier_dropout: dropout before the classifier.
      embedding_dropout: dropout after the embedding norm.
    """

    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    pad_token_id: int = 0
    num_labels: int = 0
    pooling: str = "cls"
    head_bias: bool = False
    head_activation: str = "gelu"
    classifier_dropout: float = 0.0
    embedding_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {POOLINGS}")

    @property
    def max_tokens(self) -> int:
        return self.max_positions


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """ViT, DeiT or DINOv2 (with or without registers); `num_labels == 0` means no image
    classifier (which reads the final-LN CLS token).

    With `projection_dim` E > 0 it is a dual encoder's vision tower: the pooler output is
    projected to `embeds` `[B, E]`, and a classifier (`num_labels`) is zero-shot, `logits =
    exp(logit_scale) * cos(embeds, class_embeds)` over fixed class embeddings `[C, E]`.

    Attributes:
      model_type: the HF family, `vit`, `deit`, `dinov2` or `dinov2_with_registers` (DINOv2:
        layer scale in the encoder, a classifier on CLS concatenated with the mean patch token;
        without registers, positions resized bicubically for other image sizes).
      distillation_token: DeiT's second learned token, after CLS, with its own position.
      distilled_head: `DeiTForImageClassificationWithTeacher`: the logits are the mean of a
        classifier on CLS and one on the distillation token (`distillation_classifier`).
      register_tokens: DINOv2's learned register tokens, inserted after CLS once positions are
        added (they have none); the classifier's patch mean leaves them out.
    """

    encoder: EncoderConfig
    image_size: int
    patch_size: int
    num_channels: int = 3
    pooler: bool = True
    pooler_activation: str = "tanh"
    num_labels: int = 0
    projection_dim: int = 0
    model_type: str = "vit"
    distillation_token: bool = False
    distilled_head: bool = False
    register_tokens: int = 0

    def __post_init__(self) -> None:
        if self.register_tokens and self.model_type != "dinov2_with_registers":
            raise ValueError(f"register tokens are DINOv2's, not {self.model_type!r}'s")
        if self.projection_dim and not self.pooler:
            raise ValueError("a ViT vision tower (projection_dim > 0) projects the pooler output")
        if self.distilled_head and not (self.distillation_token and self.num_labels):
            raise ValueError(
                "a distilled head reads the distillation token: it needs one, and a classifier"
            )

    @property
    def dinov2(self) -> bool:
        """DINOv2, with or without registers."""
        return self.model_type in ("dinov2", "dinov2_with_registers")


@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    eos_token_id: int


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
    encoder: EncoderConfig
    image_size: int
    patch_size: int
    num_channels: int = 3


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    text: CLIPTextConfig
    vision: CLIPVisionConfig
    projection_dim: int
    logit_scale_init: float = 2.6592


@dataclasses.dataclass(frozen=True)
class CLIPVisionTowerConfig:
    """A CLIP vision tower as a model of its own (outputs `embeds` `[B, E]`, projected).

    With `num_labels`, a zero-shot classifier: `logits = exp(logit_scale) * cos(embeds,
    class_embeds)` over fixed class embeddings `[C, E]` (for example prompt-ensemble text
    embeddings), so scoring, pruning and fusion treat it like any classifier.
    """

    vision: CLIPVisionConfig
    projection_dim: int
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


@dataclasses.dataclass(frozen=True)
class CLIPClassifierConfig:
    """HF `CLIPForImageClassification`: CLIP's vision tower; the encoder's outputs at the patch
    tokens averaged (the CLS token's final LayerNorm and the projection unused), then a dense
    layer gives `num_labels` logits. `with_classifier` makes one from a CLIP model, as
    `transformers` does from a CLIP checkpoint."""

    vision: CLIPVisionConfig
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


@dataclasses.dataclass(frozen=True)
class DualEncoderConfig:
    """HF `VisionTextDualEncoderModel`: a ViT and a BERT, each pooled and projected to E.

    `vision.projection_dim` is 0: the projections belong to the dual encoder, as in HF
    (`visual_projection`, `text_projection`); `vision_tower` moves one into the tower.
    """

    vision: ViTConfig
    text: BertConfig
    projection_dim: int
    logit_scale_init: float = 2.6592


@dataclasses.dataclass(frozen=True)
class SiglipTextConfig:
    """SigLIP's text tower: bidirectional pre-LN layers, a final LN, the last token's state
    through a dense layer (`head`, with a bias) to the `[B, E]` text embedding."""

    encoder: EncoderConfig
    vocab_size: int
    max_positions: int
    projection_dim: int


@dataclasses.dataclass(frozen=True)
class SiglipVisionConfig:
    """SigLIP's vision tower: patches (no CLS token) plus positions, pre-LN layers, a final LN
    and a multi-head attention-pooling head (a learned probe attending over every patch, then
    a LayerNorm'd MLP with a residual): its output `[B, D]` is the image embedding."""

    encoder: EncoderConfig
    image_size: int
    patch_size: int
    num_channels: int = 3


SIGLIP_LOGIT_SCALE_INIT = 2.302585  # log(10): SigLIP's training starts here
SIGLIP_LOGIT_BIAS_INIT = -10.0


@dataclasses.dataclass(frozen=True)
class SiglipConfig:
    """SigLIP: `logits_per_text = exp(logit_scale) * cos(text, image) + logit_bias`, read
    through a sigmoid (each text-image pair on its own), not a softmax."""

    text: SiglipTextConfig
    vision: SiglipVisionConfig
    logit_scale_init: float = SIGLIP_LOGIT_SCALE_INIT
    logit_bias_init: float = SIGLIP_LOGIT_BIAS_INIT


@dataclasses.dataclass(frozen=True)
class SiglipVisionTowerConfig:
    """SigLIP's vision tower as a model (outputs `embeds` `[B, D]`, the pooled image
    embedding). With `num_labels`, a zero-shot classifier: `logits = exp(logit_scale) *
    cos(embeds, class_embeds) + logit_bias` over fixed class embeddings `[C, D]`; SigLIP reads
    them through a sigmoid, our metrics through a softmax over the classes (the bias then
    cancels)."""

    vision: SiglipVisionConfig
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


@dataclasses.dataclass(frozen=True)
class SiglipClassifierConfig:
    """HF `SiglipForImageClassification`: SigLIP's vision tower without its attention-pooling
    head; the tokens after the final LayerNorm are averaged and a dense layer gives `num_labels`
    logits. `with_classifier` makes one from a SigLIP model, as `transformers` does from a
    SigLIP checkpoint."""

    vision: SiglipVisionConfig
    num_labels: int = 0

    @property
    def encoder(self) -> EncoderConfig:
        return self.vision.encoder


MemberConfig = (
    BertConfig
    | ModernBertConfig
    | ViTConfig
    | CLIPVisionTowerConfig
    | CLIPClassifierConfig
    | SiglipVisionTowerConfig
    | SiglipClassifierConfig
)


@dataclasses.dataclass(frozen=True)
class HydraConfig:
    """M head-pruned members fused into one network (Hydra Ensembles).

    `member` is the members' common (compacted) architecture, any family with a single encoder:
    `member.encoder.num_heads` are the heads each member keeps per layer.
    """

    member: MemberConfig
    num_members: int


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


# Several members of one architecture run as one network: each has `member` and `num_members`
# (`hydra_jax.models.kinds` is the table of these kinds).
EnsembleConfig = (
    HydraConfig | BatchEnsembleConfig | LoraEnsembleConfig | PackedEnsembleConfig | MimoConfig
)


def member_of(config: Any) -> Any:
    """The members' architecture of an ensemble config (one holding `member` and
    `num_members`), else None: `config` is one model's."""
    return getattr(config, "member", None) if hasattr(config, "num_members") else None


ArchConfig = (
    BertConfig
    | ModernBertConfig
    | ViTConfig
    | CLIPConfig
    | CLIPVisionTowerConfig
    | CLIPClassifierConfig
    | DualEncoderConfig
    | SiglipConfig
    | SiglipVisionTowerConfig
    | SiglipClassifierConfig
    | HydraConfig
    | BatchEnsembleConfig
    | LoraEnsembleConfig
    | PackedEnsembleConfig
    | MimoConfig
)


def with_compute_dtype(config: ArchConfig, dtype: str) -> ArchConfig:
    """`config` with every encoder (both towers of a dual encoder, a Hydra's member) computing
    in `dtype`; nothing else changes."""
    if isinstance(config, EncoderConfig):
        return dataclasses.replace(config, dtype=dtype)
    changes = {
        f.name: with_compute_dtype(value, dtype)
        for f in dataclasses.fields(config)
        if dataclasses.is_dataclass(value := getattr(config, f.name))
    }
    return dataclasses.replace(config, **changes)
