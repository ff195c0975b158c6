"""The package's one dependency direction (hydra_jax/__init__.py), read from the imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
PACKAGE = REPO / "hydra_jax"

LAYERS = {
    "checks": 0, "extras": 0, "models": 0, "metrics": 0, "native": 0, "testing": 0,
    "convert": 1, "heads": 1, "ensembles": 1,
    "data": 2, "training": 2, "evaluation": 2,
    "experiments": 3,
}  # fmt: skip
ENTRY_POINTS = ("train.py", "evaluate.py", "compare.py")


def unit(path: Path) -> str:
    """The layer unit of a module: its top-level package or module under hydra_jax/."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_units(path: Path) -> set[str]:
    """The hydra_jax units a file imports (`from hydra_jax import X` counts as unit X)."""
    units = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "hydra_jax" and len(parts) > 1 and parts[1] in LAYERS:
                units.add(parts[1])
    return units


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.name != "__init__.py")


def test_every_unit_has_a_layer():
    assert {unit(p) for p in MODULES} == set(LAYERS)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_imports_a_layer_above_its_own(path):
    own = unit(path)
    above = {u for u in imported_units(path) if LAYERS[u] > LAYERS[own]}
    assert not above, f"{path.relative_to(REPO)} (layer {LAYERS[own]}) imports {sorted(above)}"


def test_units_of_one_layer_import_each_other_without_cycles():
    edges = {u: set() for u in LAYERS}
    for path in MODULES:
        edges[unit(path)] |= imported_units(path) - {unit(path)}
    visiting, done = set(), set()

    def visit(u: str, trail: tuple[str, ...]) -> None:
        assert u not in visiting, f"import cycle: {' -> '.join((*trail, u))}"
        if u in done:
            return
        visiting.add(u)
        for v in sorted(edges[u]):
            visit(v, (*trail, u))
        visiting.discard(u)
        done.add(u)

    for u in LAYERS:
        visit(u, ())


def test_heads_and_ensembles_know_nothing_of_datasets_or_optimisers():
    for path in [
        *PACKAGE.joinpath("heads").glob("*.py"),
        *PACKAGE.joinpath("ensembles").glob("*.py"),
    ]:
        text = path.read_text()
        assert "import optax" not in text and "tensorflow_datasets" not in text, path
        assert not imported_units(path) & {"data", "training", "evaluation"}, path


def test_entry_points_stay_thin():
    for name in ENTRY_POINTS:
        assert len((REPO / name).read_text().splitlines()) < 70, name
