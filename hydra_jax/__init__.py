"""hydra_jax: uncertainty-aware, efficient transformers (Hydra Ensembles, HIES) in JAX.

The package has one dependency direction; a module imports only its own layer or those below:

  0. `models` (the functional model of every family in `models.architectures`, zero-shot
     heads, the fused Hydra, the single-pass ensembles, device meshes in `models.sharding`),
     `metrics` (numpy), `checks` (argument checks every layer shares), `extras` (the optional
     `studies` packages, imported with a message naming the extra), `testing`
  1. `convert` (HF checkpoints in and out, our own format), `heads` (scores, selection,
     compaction, circuit search), `ensembles` (fusion, member head sets, baselines, the
     single-pass ensembles' builders): no datasets, no optimisers
  2. `data` (the dataset protocol, text and image sources, the user's files, the Grain
     loader), `training` (`fit`), `evaluation` (predictions, reports, seeds)
  3. `experiments` (the study engine: methods, evaluators, analyses, workdirs; the CLI)
  4. the entry points `train.py`, `evaluate.py`, `compare.py`, `seeds.py` and `hydra-jax`

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

__version__ = "0.2.0.dev0"  # the one place the version is written (pyproject.toml reads it)

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
