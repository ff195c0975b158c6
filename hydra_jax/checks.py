"""Argument checks shared by every layer (numpy only): a count that must be an integer."""

from __future__ import annotations

import numpy as np

_KIND = {0: "a non-negative integer", 1: "a positive integer"}


def count(name: str, value: object, minimum: int = 1) -> int:
    """`value` as an `int` of at least `minimum`, or a ValueError naming `name`.

    Python and NumPy integers pass; `bool`, floats and strings do not (`True` is not a count).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        kind = _KIND.get(minimum, f"an integer of at least {minimum}")
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value)
