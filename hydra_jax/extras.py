"""Optional dependencies: the packages of the `studies` extra, imported with a message naming it.

The library core (models, conversion, heads, ensembles, metrics) needs only what
`pip install hydra_jax` installs. The studies (`hydra_jax.experiments`, `hydra_jax.training`,
the embedded datasets, the user-file readers, plots) also need `pip install "hydra_jax[studies]"`;
importing one of them without it raises a ModuleNotFoundError that says so.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# The top-level modules of the `studies` extra (pyproject.toml) that the package imports.
STUDIES = (
    "absl",
    "datasets",
    "grain",
    "matplotlib",
    "ml_collections",
    "pyarrow",
    "tensorboardX",
    "tensorflow_datasets",
)
INSTALL = "pip install 'hydra_jax[studies]'"


def _message(missing: list[str], needed_by: str) -> str:
    return f"{needed_by} needs the studies extra ({', '.join(missing)} not installed): {INSTALL}"


def require_studies(needed_by: str) -> None:
    """Raises ModuleNotFoundError naming the extra when any of its modules is not installed.

    Args:
      needed_by: what needs them, for the message (e.g. "hydra_jax.experiments").
    """
    missing = [name for name in STUDIES if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(_message(missing, needed_by), name=missing[0])


def studies_import(name: str, needed_by: str) -> ModuleType:
    """`importlib.import_module(name)` for a module of the studies extra, or a ModuleNotFoundError
    that says which extra to install.

    Args:
      name: a dotted module name whose top-level package is in `STUDIES` (e.g. "pyarrow.parquet").
      needed_by: what needs it, for the message (e.g. "parquet: data files").
    """
    top = name.partition(".")[0]
    if top not in STUDIES:
        raise ValueError(f"{name} is not a module of the studies extra ({', '.join(STUDIES)})")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != top:
            raise  # something the module itself imports is missing: not ours to explain
        raise ModuleNotFoundError(_message([top], needed_by), name=top) from error
