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
  4. the entry points `train.py`, `evaluate.py`, `seeds.py` and `hydra-jax`

`tests/test_layers.py` reads every import and holds the package to it. `import hydra_jax`
needs only the core dependencies; the studies' packages (`pip install "hydra_jax[studies]"`)
load where they are used.
"""

from typing import Any

from hydra_jax import data, ensembles, heads, metrics, models
from hydra_jax.convert import (
    ConversionError,
    from_pretrained,
    load_model,
    minilm_l6_path,
    save_model,
    save_pretrained,
)
from hydra_jax.models import Model, vision_tower, with_classifier, with_dtype, with_remat, zero_shot

__version__ = "0.2.0.dev0"  # the one place the version is written (pyproject.toml reads it)

hydra = ensembles  # the Hydra API under its own name: `hj.hydra.fuse(members)`


def plan(config: Any, target: str, mesh: dict[str, int] | None = None) -> dict[str, Any]:
    """`hydra-jax plan` as a function: a config's programs compiled for `target` (`cpu:N`, or a
    TPU topology such as `v5e:2x4` through libtpu, `pip install "hydra_jax[tpu]"`) on a mesh of
    axis sizes (default: every device on `data`), with abstract weights. `config`: a config
    file `FILE[:ARG]` or its `ml_collections.ConfigDict`. Returns `{"target", "devices",
    "mesh", "rows"}`, a row per method and program (`hydra_jax.experiments.aot.Row`).

    Needs the studies extra (the config system); a `cpu:N` target needs N CPU devices set before
    JAX starts (`JAX_NUM_CPU_DEVICES`; the command line sets them itself)."""
    from hydra_jax.experiments import aot  # the top of the package: loaded when called

    return aot.plan(aot.load_config(config) if isinstance(config, str) else config, target, mesh)


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
    "plan",
    "save_model",
    "save_pretrained",
    "vision_tower",
    "with_classifier",
    "with_dtype",
    "with_remat",
    "zero_shot",
]
