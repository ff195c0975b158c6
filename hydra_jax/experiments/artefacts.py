"""What a study publishes and loads back: its from-scratch ViT, member classifiers as HF
directories (with an image processor that reproduces our pixels), saved fused Hydras and
pruned members as methods.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import ml_collections

from hydra_jax import data
from hydra_jax.convert import from_pretrained, save_pretrained
from hydra_jax.convert.native import load_model
from hydra_jax.evaluation import Method, model_method
from hydra_jax.experiments.study_data import checkpoint_dir, num_classes
from hydra_jax.experiments.workdir import layout
from hydra_jax.models import EncoderConfig, Model, ViTConfig, with_dtype
from hydra_jax.models.sharding import barrier, is_primary, to_host


def hf_dir(workdir: Path, member: int) -> Path:
    """Where a study publishes member `member`'s classifier."""
    return layout(workdir, "member", m=member)


def zero_shot_dir(workdir: Path) -> Path:
    """Where a zero-shot study saves its classifier (our format: it has no HF class)."""
    return layout(workdir, "zero_shot")


def base_model(config: ml_collections.ConfigDict) -> Model:
    return from_pretrained(checkpoint_dir(config))


def scratch_config(config: ml_collections.ConfigDict) -> ViTConfig:
    """The ViT of `config.model`, for grey images of the study's size and its classes."""
    m = config.model
    if m.width % m.heads:
        raise ValueError(f"model.width {m.width} is not a multiple of model.heads {m.heads}")
    encoder = EncoderConfig(
        num_heads=(m.heads,) * m.layers,
        width=m.width,
        head_dim=m.width // m.heads,
        mlp_dim=m.mlp_dim,
        activation="gelu",
        layer_norm_eps=1e-12,  # HF ViTConfig's default
        pre_norm=True,
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
    )
    return ViTConfig(
        encoder=encoder,
        image_size=data.IMAGE_SIZE,
        patch_size=m.patch_size,
        num_channels=1,
        pooler=False,  # ViTForImageClassification has none
        num_labels=num_classes(config),
    )


# What a checkpoint carries besides its weights: its tokenizer or image processor.
PREPROCESSING_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "spm.model",
    "preprocessor_config.json",
)


def publish(
    model: Model, path: Path, *, files_from: Path | None = None, our_pixels: bool = False
) -> None:
    """Writes `model` as an HF directory, with the preprocessing files of the checkpoint
    directory `files_from` beside it, and (`our_pixels`, for the studies' embedded images) the
    `preprocessor_config.json` of `ViTImageProcessor` that reproduces our pixels
    (`data.to_pixels`). Every process takes part (the weights are gathered from all of them);
    process 0 writes."""
    model = Model(model.config, jax.tree.map(to_host, model.params))
    if is_primary():
        save_pretrained(model, path)
        for name in PREPROCESSING_FILES if files_from else ():
            if (Path(files_from) / name).is_file():
                shutil.copy(Path(files_from) / name, Path(path) / name)
        if our_pixels:
            _write_pixel_processor(Path(path))
    barrier(f"published {path}")


def _write_pixel_processor(path: Path) -> None:
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": data.IMAGE_SIZE, "width": data.IMAGE_SIZE},
        "resample": 2,  # bilinear
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [data.images.PIXEL_MEAN],
        "image_std": [data.images.PIXEL_STD],
        "do_convert_rgb": False,
    }
    (path / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))


def saved_method(name: str, path: Path, dtype: str) -> Method:
    """The model `save_model` wrote to `path` as method `name`, computing in `dtype`."""
    model = with_dtype(load_model(path), dtype)  # a fused Hydra, or one pruned member
    return model_method(name, model)
