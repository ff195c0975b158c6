"""hydra_jax: uncertainty-aware, efficient transformers (Hydra Ensembles, HIES) in JAX.

The package has one dependency direction; a module imports only its own layer or those below:

  0. `models` (functional BERT / ViT / CLIP / dual encoders, zero-shot heads, the fused
     Hydra), `metrics` (numpy), `checks` (argument checks every layer shares), `extras`
     (the optional `studies` packages, imported with a message naming the extra)
  1. `convert` (checkpoints), `heads` (scores, selection, surgery, circuit search),
     `ensembles` (fusion, member strategies, baselines): no datasets, no optimisers
  2. `data` (the dataset protocol, text, TFDS builders), `training`, `evaluation`
  3. `experiments` (baselines, pruning curves, Hydra; the CLI helpers)
  4. the entry points `train.py`, `evaluate.py`, `compare.py`

`tests/test_layers.py` reads every import and holds the package to it. `import hydra_jax`
needs only the core dependencies; the studies' packages (`pip install "hydra_jax[studies]"`)
load where they are used.
"""

from hydra_jax import data, ensembles, heads, metrics, models
from hydra_jax.convert import (
    ConversionError,
    from_pretrained,
    load_model,
    minilm_l6_path,
    save_model,
    save_pretrained,
)
from hydra_jax.models import Model, vision_tower, with_classifier, with_dtype, zero_shot

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

hydra = ensembles  # the Hydra API under its own name: `hj.hydra.fuse(members)`

__all__ = [
    "ConversionError",
    "Model",
    "__version__",
    "data",
    "ensembles",
    "from_pretrained",
    "heads",
    "hydra",
    "load_model",
    "metrics",
    "minilm_l6_path",
    "models",
    "save_model",
    "save_pretrained",
    "vision_tower",
    "with_classifier",
    "with_dtype",
    "zero_shot",
]
