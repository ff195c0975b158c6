"""Our own checkpoint format, for models an HF directory cannot express (a fused Hydra, a
compacted model whose layers keep different head counts): the config as tagged JSON and the
weights as an orbax checkpoint."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from hydra_jax.models import ARCHITECTURES, Model, kinds
from hydra_jax.models.sharding import is_primary


def _config_classes() -> dict[str, type]:
    """Every config class a saved model may hold, by name: the families' (`ARCHITECTURES`), the
    ensemble kinds' (`kinds.KINDS`) and the configs their fields hold (encoders, towers, ...)."""
    found: dict[str, type] = {}
    todo: list[Any] = [*ARCHITECTURES, *kinds.KINDS]
    while todo:
        cls = todo.pop()
        if not dataclasses.is_dataclass(cls) or cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for hint in typing.get_type_hints(cls).values():
            todo += [hint, *typing.get_args(hint)]
    return found


CONFIG_FILE = "model_config.json"


def _encode(x: Any) -> Any:
    if dataclasses.is_dataclass(x):
        fields = {f.name: _encode(getattr(x, f.name)) for f in dataclasses.fields(x)}
        return {"__config__": type(x).__name__, **fields}
    return list(x) if isinstance(x, tuple) else x


def _decode(x: Any, known: dict[str, type]) -> Any:
    """The config `_encode` wrote; `known`: the config classes by name (`_config_classes`)."""
    if isinstance(x, dict) and "__config__" in x:
        kind = x["__config__"]
        if kind not in known:
            raise ValueError(f"unknown config kind {kind!r}; known: {sorted(known)}")
        fields = {k: _decode(v, known) for k, v in x.items() if k != "__config__"}
        return known[kind](**fields)
    return tuple(x) if isinstance(x, list) else x  # the only lists are head-count tuples


def save_model(model: Model, path: str | Path) -> None:
    """Writes `model` (any architecture) to the directory `path`."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    if is_primary():  # several processes: all save the weights (orbax), process 0 the config
        (path / CONFIG_FILE).write_text(json.dumps(_encode(model.config), indent=2))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "params", model.params, force=True)
    checkpointer.wait_until_finished()


def load_model(path: str | Path) -> Model:
    """Restores a model written by `save_model`.

    Raises:
      FileNotFoundError: `path` holds no saved model.
    """
    path = Path(path).absolute()
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} holds no saved model (no {CONFIG_FILE})")
    config = _decode(json.loads((path / CONFIG_FILE).read_text()), _config_classes())
    target = jax.eval_shape(lambda: Model.init(config, jax.random.key(0)).params)
    return Model(config, ocp.StandardCheckpointer().restore(path / "params", target))
