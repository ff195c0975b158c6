"""`model(**inputs)` as one compiled program per architecture, for tests that compare forwards.

Eager dispatch compiles every op of every new shape; at the suite's tiny sizes that costs more
than compiling the whole forward once. Head masks are inputs, so one program serves every mask.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

import hydra_jax as hj


@functools.cache
def _compiled(config: Any) -> Any:
    return jax.jit(lambda params, inputs: hj.Model(config, params)(**inputs))


def run(model: hj.Model, **inputs: Any) -> Any:
    """`model(**inputs)`: the same output, from one program per `model.config`."""
    return _compiled(model.config)(model.params, inputs)
