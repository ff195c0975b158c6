"""Functional transformer models: BERT, ViT and CLIP with a per-head mask.

Axis letters, used in every einsum, shape comment and docstring of the package (never reused):

  B batch           T query tokens     S key tokens       D model width
  N heads           K head dim         F MLP width        V vocab
  L layers          M members          C classes          P patch size
  E projection (embedding) dim

Attention weights keep heads as a real axis: ``query/key/value`` kernels are ``[D, N, K]``,
the output kernel is ``[N, K, D]``. The head mask (``[L, N]`` floats, 1 keeps a head, 0 removes it)
multiplies each head's context ``softmax(QK^T / sqrt(K)) V`` before the output projection: the one
place where pruning, scoring and ensembling act.
"""

from hydra_jax.models.config import (
    BertConfig,
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    EncoderConfig,
    HydraConfig,
    ViTConfig,
)
from hydra_jax.models.model import Model
from hydra_jax.models.outputs import CLIPOutput, ModelOutput

__all__ = [
    "BertConfig",
    "CLIPConfig",
    "CLIPOutput",
    "CLIPTextConfig",
    "CLIPVisionConfig",
    "EncoderConfig",
    "HydraConfig",
    "Model",
    "ModelOutput",
    "ViTConfig",
]
