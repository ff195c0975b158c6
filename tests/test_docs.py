"""The README's and the tutorials' Python blocks run as written, every relative link in the
README and the docs points at a file of the repository, every table is generated from its data
(`make tables`), and every command block of the front door is run or checked.

A page's ```` ```python ```` blocks run in order in one namespace, in a scratch directory (what
they write stays there); blocks fenced ```` ```py ```` are shown, not run (code for the reader's
own checkpoint or files).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts import tables

REPO = Path(__file__).parent.parent
PAGES = [
    *(REPO / name for name in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")),
    *sorted((REPO / "docs").rglob("*.md")),
]


def python_blocks(path: Path) -> list[str]:
    """Each block padded with blank lines, so a traceback gives the page's own line numbers."""
    text = path.read_text()
    return [
        "\n" * text.count("\n", 0, match.start(1)) + match.group(1)
        for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)
    ]


TUTORIALS = sorted((REPO / "docs" / "tutorials").glob("*.md"))


def run_blocks(page: Path, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page)
    assert blocks, f"{page.name} has no Python block"
    monkeypatch.chdir(directory)
    namespace: dict = {"__name__": f"page_{page.stem}"}
    for block in blocks:  # one namespace: later blocks may use what earlier ones defined
        exec(compile(block, str(page.relative_to(REPO)), "exec"), namespace)


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path, monkeypatch):
    run_blocks(REPO / "README.md", tmp_path, monkeypatch)


def test_the_docs_quickstart_runs(tmp_path, monkeypatch):
    run_blocks(REPO / "docs" / "index.md", tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_python_blocks_run(page, tmp_path, monkeypatch):
    run_blocks(page, tmp_path, monkeypatch)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    text = page.read_text()
    assert "../shared" not in text  # users have the repository only
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_table_block_is_what_its_data_generate():
    """`make tables` leaves every page as it is: no table figure is typed by hand."""
    for page in tables.pages(REPO):
        text = page.read_text()
        assert tables.rewrite(text) == text, f"{page.name}: run `make tables`"


def test_a_table_block_is_rewritten_from_its_data(tmp_path):
    """Blocks take the data's figures, columns and rows by name, a caption, and verdicts."""
    data = {
        "t": {
            "cpu": "2-core CPU",
            "date": "2026-01-02",
            "source": "`x.py`",
            "columns": [
                {"name": "method", "header": "method"},
                {"name": "id.acc", "header": "acc %", "fmt": ".1f", "scale": 100},
                {
                    "name": "d",
                    "header": "a - b",
                    "keys": ["d.d", "d.lo", "d.hi"],
                    "style": "verdict",
                    "fmt": "+.2f",
                },
                {
                    "name": "ms",
                    "header": "ms",
                    "keys": ["ms.mean", "ms.std"],
                    "style": "mean_std",
                    "fmt": ",.0f",
                },
            ],
            "rows": [
                {
                    "method": "a",
                    "id.acc": 81.25,
                    "d.d": 1.5,
                    "d.lo": 0.25,
                    "d.hi": 2.0,
                    "ms.mean": 1234.4,
                    "ms.std": 5.0,
                },
                {
                    "method": "b",
                    "id.acc": None,
                    "d.d": -1.0,
                    "d.lo": -2.0,
                    "d.hi": 0.5,
                    "ms.mean": 1.0,
                    "ms.std": 0.0,
                },
            ],
        }
    }
    (tmp_path / "f.json").write_text(tables.dump(data))
    page = "x\n<!-- table f/t columns=method,d,ms rows=b,a -->\nstale\n<!-- end table -->\ny\n"
    assert tables.rewrite(page, tmp_path) == (
        "x\n<!-- table f/t columns=method,d,ms rows=b,a -->\n"
        "*2-core CPU; 2026-01-02; `x.py`.*\n\n| method | a - b | ms |\n|---|---|---|\n"
        "| b | -1.00 [-2.00, +0.50] draw | 1 +- 0 |\n"
        "| a | +1.50 [+0.25, +2.00] **wins** | 1,234 +- 5 |\n<!-- end table -->\ny\n"
    )
    full = tables.rewrite("<!-- table f/t -->\n<!-- end table -->", tmp_path)
    assert "| b | - | -1.00" in full  # a missing figure prints "-"
    with pytest.raises(KeyError, match="no column"):
        tables.rewrite("<!-- table f/t columns=method,nope -->\n<!-- end table -->", tmp_path)
    with pytest.raises(KeyError, match="no table 'u'"):
        tables.rewrite("<!-- table f/u -->\n<!-- end table -->", tmp_path)
    # collect: a method row from an evaluated workdir's results.json, scaled
    run = tmp_path / "run"
    run.mkdir()
    methods = {"a": {"id": {"acc": 0.5}}, "b": {"id": {"acc": 0.75}}}
    (run / "results.json").write_text(json.dumps({"methods": methods}))
    data["t"]["columns"] = data["t"]["columns"][:2]
    (tmp_path / "f.json").write_text(tables.dump(data))
    tables.collect("f", "t", [run], tmp_path)
    rows = json.loads((tmp_path / "f.json").read_text())["t"]["rows"]
    assert [r["id.acc"] for r in rows] == [50.0, 75.0]


def test_a_from_column_reads_its_figures_from_the_table_that_keeps_them(tmp_path):
    """A figure is kept once: a `from` column shows another table's row, by its first cell."""
    diff = {"cpu": "c", "date": "d", "columns": [{"name": "pair", "header": "a - b"}],
            "rows": [{"pair": "x - y", "points": 1.5, "lo": -0.5, "hi": 3.0}]}  # fmt: skip
    glance = {"cpu": "c", "date": "d", "columns": [
        {"name": "rival", "header": "rival"},
        {"name": "demo", "header": "demo", "from": "diff", "row": "pair",
         "keys": ["points", "lo", "hi"], "style": "verdict", "fmt": "+.1f"},
    ], "rows": [{"rival": "Y", "pair": "x - y"}, {"rival": "Z", "pair": "x - z"}]}  # fmt: skip
    (tmp_path / "f.json").write_text(tables.dump({"diff": diff, "glance": glance}))
    page = tables.rewrite("<!-- table f/glance -->\n<!-- end table -->", tmp_path)
    assert "| Y | +1.5 [-0.5, +3.0] draw |" in page and "| Z | - |" in page


def test_every_bash_block_of_the_front_door_is_run_or_checked():
    """README.md's and docs/your_data.md's bash blocks: the study commands are run by
    tests/test_custom_study.py (the README's is docs/your_data.md's first block, as written);
    `make` targets exist in the Makefile, `pip install` extras in pyproject.toml (CI runs
    `make docs`, `make release-check` and `make test`; the release check installs the wheel)."""
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    extras = {"studies", "test", "docs"}
    pages = ("README.md", "docs/your_data.md")
    pattern = re.compile(r"^```bash\n(.*?)^```$", flags=re.S | re.M)
    blocks = {page: pattern.findall((REPO / page).read_text()) for page in pages}
    assert len(blocks["docs/your_data.md"]) == 3  # each run by test_custom_study.py
    study = blocks["docs/your_data.md"][0]
    for block in blocks["README.md"]:
        if "--config" in block:
            assert block == study, "the README's study command must be docs/your_data.md's"
            continue
        for line in block.splitlines():
            command = line.split("#")[0].split()
            if not command:
                continue
            if command[:2] == ["pip", "install"]:
                named = re.findall(r"\[([\w,]+)\]", line)
                assert all(set(n.split(",")) <= extras for n in named), line
            else:
                assert command[:1] == ["make"] and command[1] in targets, line


def test_a_compare_csv_becomes_a_docs_table(tmp_path):
    """scripts/tables.py compared: the rows `hydra-jax compare --csv` wrote, as a table."""
    from hydra_jax.experiments.compare import COLUMNS

    with open(tmp_path / "c.csv", "w") as file:
        file.write(",".join(COLUMNS) + "\n")
        file.write("id.ece,0.1,0.01,0.2,0.02,-0.1,-0.15,-0.05,lower,win\n")
        file.write("cost.latency_ms,5,1,9,1,-4,nan,nan,,\n")
    (tmp_path / "f.json").write_text(tables.dump({}))
    tables.compared("f", "t", tmp_path / "c.csv", ["id.ece", "cost.latency_ms"], "2-core CPU",
                    "`x`", tmp_path)  # fmt: skip
    page = tables.rewrite("<!-- table f/t -->\n<!-- end table -->", tmp_path)
    assert (
        "| id.ece | 0.1000 +- 0.0100 | 0.2000 +- 0.0200 | -0.1000 | [-0.1500, -0.0500] | win |"
        in page
    )
    assert "| cost.latency_ms | 5.0000 +- 1.0000 | 9.0000 +- 1.0000 | -4.0000 |" in page
    with pytest.raises(KeyError, match="has no"):
        tables.compared("f", "t", tmp_path / "c.csv", ["id.nll"], "cpu", "x", tmp_path)
