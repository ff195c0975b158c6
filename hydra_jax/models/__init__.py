"""Functional transformer models: the BERT family (BERT, RoBERTa, XLM-RoBERTa, CamemBERT,
ELECTRA, DistilBERT, DeBERTa-v2/v3), ModernBERT, ViT, DeiT, DINOv2 (with registers too), CLIP,
SigLIP and ViT-BERT dual encoders, with a per-head mask; each architecture is one entry of the
table `ARCHITECTURES`; each kind of ensemble held in one network (a fused Hydra, BatchEnsemble,
LoRA-Ensemble, Packed-Ensembles, MIMO) is one entry of the table `kinds.KINDS`.

Axis letters, used in every einsum, shape comment and docstring of the package (never reused):

  B batch           T query tokens     S key tokens       D model width
  N heads           K head dim         F MLP width        V vocab
  L layers          M members          C classes          P patch size
  E projection (embedding) dim           R relative-distance embeddings (DeBERTa; 2A of them)

Attention weights keep heads as a real axis: ``query/key/value`` kernels are ``[D, N, K]``,
the output kernel is ``[N, K, D]``. The head mask (``[L, N]`` floats, 1 keeps a head, 0 removes it)
multiplies each head's context ``softmax(QK^T / sqrt(K)) V`` before the output projection: the one
place where pruning, scoring and ensembling act.
"""

from hydra_jax.models import kinds
from hydra_jax.models.architectures import (
    ARCHITECTURES,
    MemberConfig,
    check_inputs,
    encoder_of,
    input_names,
)
from hydra_jax.models.bert import BertConfig
from hydra_jax.models.clip import (
    CLIPClassifierConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    CLIPVisionTowerConfig,
)
from hydra_jax.models.config import EncoderConfig, RelativeAttention, member_of
from hydra_jax.models.dual_encoder import DualEncoderConfig
from hydra_jax.models.efficient import BatchEnsembleConfig, LoraEnsembleConfig
from hydra_jax.models.fused import HydraConfig
from hydra_jax.models.mimo import MimoConfig
from hydra_jax.models.model import Model, vision_tower, with_classifier, with_dtype, with_remat
from hydra_jax.models.modernbert import ModernBertConfig
from hydra_jax.models.outputs import CLIPOutput, ModelOutput, Stem
from hydra_jax.models.packed import PackedEnsembleConfig
from hydra_jax.models.siglip import (
    SiglipClassifierConfig,
    SiglipConfig,
    SiglipTextConfig,
    SiglipVisionConfig,
    SiglipVisionTowerConfig,
)
from hydra_jax.models.vit import ViTConfig
from hydra_jax.models.zero_shot import prompt_embeddings, prompts, zero_shot

__all__ = [
    "ARCHITECTURES",
    "BatchEnsembleConfig",
    "BertConfig",
    "CLIPClassifierConfig",
    "CLIPConfig",
    "CLIPOutput",
    "CLIPTextConfig",
    "CLIPVisionConfig",
    "CLIPVisionTowerConfig",
    "DualEncoderConfig",
    "EncoderConfig",
    "HydraConfig",
    "LoraEnsembleConfig",
    "MemberConfig",
    "MimoConfig",
    "Model",
    "ModelOutput",
    "ModernBertConfig",
    "PackedEnsembleConfig",
    "RelativeAttention",
    "SiglipClassifierConfig",
    "SiglipConfig",
    "SiglipTextConfig",
    "SiglipVisionConfig",
    "SiglipVisionTowerConfig",
    "Stem",
    "ViTConfig",
    "check_inputs",
    "encoder_of",
    "input_names",
    "kinds",
    "member_of",
    "prompt_embeddings",
    "prompts",
    "vision_tower",
    "with_classifier",
    "with_dtype",
    "with_remat",
    "zero_shot",
]
