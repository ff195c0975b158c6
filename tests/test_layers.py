"""The package's one dependency direction (hydra_jax/__init__.py), read from the imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
PACKAGE = REPO / "hydra_jax"

LAYERS = {
    "checks": 0, "extras": 0, "models": 0, "metrics": 0, "testing": 0,
    "convert": 1, "heads": 1, "ensembles": 1,
    "data": 2, "training": 2, "evaluation": 2,
    "experiments": 3,
}  # fmt: skip
ENTRY_POINTS = ("train.py", "evaluate.py", "seeds.py")


def unit(path: Path) -> str:
    """The layer unit of a module: its top-level package or module under hydra_jax/."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


# Calls that import a module named by a string, and the modules allowed to pass them a name
# that is not a constant (extras.py imports the studies' third-party packages by name).
STRING_IMPORTS = {"resolve_name", "import_module", "__import__"}
DYNAMIC_IMPORTS = {"extras.py"}
# A string that names a hydra_jax module or object: "hydra_jax.unit.module[:name]".
MODULE_NAME = re.compile(r"hydra_jax(\.\w+)+(:\w+(\.\w+)*)?")


def called_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def string_import(node: ast.Call, path: Path) -> list[str]:
    """The module a string import names (its constant prefix for an f-string), or ["?"] where
    the name is not a constant and `path` may not import by a computed name."""
    target = node.args[0] if node.args else None
    if isinstance(target, ast.JoinedStr) and target.values:
        target = target.values[0]
    if isinstance(target, ast.Constant) and isinstance(target.value, str):
        return [target.value.split(":")[0]]
    return [] if path.name in DYNAMIC_IMPORTS else ["?"]


def imported_units(path: Path) -> set[str]:
    """The hydra_jax units a file imports (`from hydra_jax import X` counts as unit X), by an
    import statement, by a string import (`importlib.import_module`, `pkgutil.resolve_name`,
    `__import__`; a name that is not a constant string counts as the unit "?"), or by naming a
    module in a string constant ("hydra_jax.unit.module:function", resolved later)."""
    units = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and called_name(node) in STRING_IMPORTS:
            names = string_import(node, path)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value.split(":")[0]] if MODULE_NAME.fullmatch(node.value) else []
        else:
            continue
        units |= {"?"} & set(names)
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
    found = imported_units(path)
    assert "?" not in found, f"{path.relative_to(REPO)} imports a module named at run time"
    above = {u for u in found if LAYERS[u] > LAYERS[own]}
    assert not above, f"{path.relative_to(REPO)} (layer {LAYERS[own]}) imports {sorted(above)}"


def test_units_of_one_layer_import_each_other_without_cycles():
    edges = {u: set() for u in LAYERS}
    for path in MODULES:
        edges[unit(path)] |= imported_units(path) - {unit(path), "?"}
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


@pytest.mark.parametrize(
    ("source", "units"),
    [
        ("import importlib as i\ni.import_module('hydra_jax.experiments.engine')", {"experiments"}),
        ("from importlib import *\nimport_module(f'hydra_jax.training.{x}')", {"training"}),
        ("import pkgutil as p\np.resolve_name('hydra_jax.ensembles.x:mimo_from')", {"ensembles"}),
        ("__import__('hydra_jax.data')", {"data"}),
        ("HOOKS = {'mimo': 'hydra_jax.training:mimo_loss_from'}", {"training"}),
        ("import importlib\nimportlib.import_module(name)", {"?"}),
        ('"""Docs naming `hydra_jax.training`."""\nprint("pip install hydra_jax[studies]")', set()),
    ],
)  # fmt: skip
def test_string_imports_count_as_imports(tmp_path, source, units):
    """A lower layer cannot reach a higher one through a module named in a string either."""
    module = tmp_path / "module.py"
    module.write_text(source)
    assert imported_units(module) == units


def test_configs_import_nothing_from_the_study_engine():
    """Configs are data (big_vision's import only ml_collections): evaluators, scores and
    methods by name. `custom.py` re-exports the packaged generic study's config."""
    for path in sorted((REPO / "configs").glob("*.py")):
        if path.name in ("custom.py", "__init__.py"):
            continue
        assert "experiments" not in imported_units(path), path.name
