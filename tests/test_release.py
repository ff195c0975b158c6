"""The release: dependency ranges and their tested floors, the studies extra's messages, the
`hydra-jax` command, and one version everywhere. (`make release-check` installs the wheel.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hydra_jax as hj
from hydra_jax import extras
from hydra_jax.experiments import cli
from scripts.lower_bounds import floors
from scripts.release_check import NOT_ON_IMPORT

REPO = Path(__file__).parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_floors_pin_each_lower_bound_and_refuse_a_requirement_without_one():
    requirements = ["jax>=0.8.1", "transformers>=5.0.0,<6", "a[b]>=1.2; python_version>='3.11'"]
    assert floors(requirements) == ["jax==0.8.1", "transformers==5.0.0", "a==1.2"]
    with pytest.raises(ValueError, match="'numpy<3' has no single '>=' lower bound"):
        floors(["numpy<3"])


def test_core_and_studies_requirements_are_ranges_with_a_tested_floor():
    for requirements in (PROJECT["dependencies"], PROJECT["optional-dependencies"]["studies"]):
        assert not [r for r in requirements if "==" in r], requirements
        assert len(floors(requirements)) == len(requirements)


def test_the_studies_extra_lists_every_package_extras_guards():
    declared = " ".join(PROJECT["optional-dependencies"]["studies"]).lower().replace("-", "_")
    for module in extras.STUDIES:
        package = {"absl": "absl_py", "tensorflow_datasets": "tensorflow_datasets"}.get(module)
        assert (package or module).lower() in declared, module


@pytest.mark.processes
def test_import_hydra_jax_loads_no_study_or_test_package():
    """With every package installed (the release check repeats it where none of the extras is)."""
    code = f"import sys, hydra_jax; print(sorted(m for m in {NOT_ON_IMPORT!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.processes
@pytest.mark.parametrize(
    ("blocked", "statement"),
    [
        ("ml_collections", "import hydra_jax.experiments"),
        ("grain", "import hydra_jax.training"),
        ("tensorflow_datasets", "import hydra_jax.data.sentences"),
        ("matplotlib", "from hydra_jax.evaluation.report import pyplot; pyplot()"),
    ],
)
def test_a_study_module_without_the_extra_names_it(blocked, statement):
    """Each study module, with one of the extra's packages missing (None in sys.modules)."""
    code = f"import sys; sys.modules[{blocked!r}] = None; {statement}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:") and blocked in last, last
    assert "pip install 'hydra_jax[studies]'" in last, last


def test_a_test_not_marked_processes_starts_none():
    """`make test` runs the tests not marked `processes`, and one that starts a process fails,
    naming the marker (tests/conftest.py), so the in-process suite stays in-process."""
    with pytest.raises(AssertionError, match=r"starts a process .* mark it @pytest.mark.processes"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_studies_import_refuses_a_package_outside_the_extra():
    with pytest.raises(ValueError, match="numpy is not a module of the studies extra"):
        extras.studies_import("numpy", "a test")


def test_the_command_finds_the_packaged_config_by_name():
    custom = str(cli.PACKAGED_CONFIGS["custom"])
    assert cli.PACKAGED_CONFIGS["custom"].is_file()
    argv = ["--config", "custom:smoke", "--workdir", "w", "--config.model=custom"]
    assert cli.packaged_config(argv) == ["--config", f"{custom}:smoke", *argv[2:]]
    assert cli.packaged_config(["--config=custom"]) == [f"--config={custom}"]
    assert cli.packaged_config(["--config=configs/minilm_mr.py:demo"]) == [
        "--config=configs/minilm_mr.py:demo"
    ]


def test_the_command_without_a_stage_prints_its_usage(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["hydra-jax"])
    assert exit.value.code == 2 and "usage: hydra-jax {train,evaluate}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        cli.main(["hydra-jax", "--help"])
    assert exit.value.code == 0 and "--config custom" in capsys.readouterr().out


def test_the_repositorys_custom_config_is_the_packaged_one():
    from configs import custom
    from hydra_jax.experiments import custom as packaged

    assert custom.get_config is packaged.get_config


def test_one_version_in_the_package_changelog_and_citation():
    """A release's version heads the changelog; between releases the version is the next one's
    `.dev0` and the changelog's top section is `[Unreleased]`, so a citation of a version never
    names two programs."""
    version = hj.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev0)?", version)
    assert PROJECT["dynamic"] == ["version"]
    sections = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    if version.endswith(".dev0"):
        assert sections[0] == "Unreleased" and version.removesuffix(".dev0") not in sections
    else:
        assert sections[0] == version
    citation = (REPO / "CITATION.cff").read_text()
    assert f"\nversion: {version}\n" in citation
    assert ("date-released" in citation) != version.endswith(".dev0")
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
