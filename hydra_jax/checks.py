"""Argument checks shared by every layer (numpy only): a count that must be an integer, names
given as a sequence or comma-separated."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_KIND = {0: "a non-negative integer", 1: "a positive integer"}


def is_count(value: object, minimum: int = 1) -> bool:
    """Whether `value` is an integer of at least `minimum`.

    Python and NumPy integers pass; `bool`, floats and strings do not (`True` is not a count).
    """
    return not isinstance(value, bool) and isinstance(value, int | np.integer) and value >= minimum


def count(name: str, value: object, minimum: int = 1) -> int:
    """`value` as an `int` of at least `minimum` (`is_count`), or a ValueError naming `name`."""
    if not is_count(value, minimum):
        kind = _KIND.get(minimum, f"an integer of at least {minimum}")
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value)


def split_names(names: Sequence[str] | str) -> list[str]:
    """`names`, a sequence or comma-separated as on the command line
    (`single,deep_ensemble,hydra_taylor`), as a list."""
    if isinstance(names, str):
        return [n.strip() for n in names.split(",") if n.strip()]
    return list(names)
