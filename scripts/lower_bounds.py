"""Prints the declared lower bounds of the core and the studies extra as pip constraints.

    python scripts/lower_bounds.py > floors.txt
    pip install -c floors.txt "dist/hydra_jax-0.1.0-py3-none-any.whl[studies]"

Each `>=` of `[project].dependencies` and of the `studies` extra in pyproject.toml becomes an
exact pin (`name==floor`), so the wheel is installed with every dependency at the oldest version
it declares; CI runs the library's tests there (`make lower-bounds`). A dependency without a
lower bound is refused: its floor would be untested.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
_FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*(.*)$")


def floors(requirements: list[str]) -> list[str]:
    """`["jax>=0.7.1", "transformers>=5.0.0,<6"]` -> `["jax==0.7.1", "transformers==5.0.0"]`."""
    pins = []
    for requirement in requirements:
        name, spec = _FLOOR.match(requirement.split(";")[0].strip()).groups()
        lower = [part.strip()[2:] for part in spec.split(",") if part.strip().startswith(">=")]
        if len(lower) != 1:
            raise ValueError(f"{requirement!r} has no single '>=' lower bound to test")
        pins.append(f"{name}=={lower[0].strip()}")
    return pins


def main() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["studies"]
    sys.stdout.write("".join(f"{pin}\n" for pin in floors(requirements)))


if __name__ == "__main__":
    main()
