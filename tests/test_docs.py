"""The README's and the tutorials' Python blocks run as written, and every relative link in the
README and the docs points at a file of the repository.

A page's ```` ```python ```` blocks run in order in one namespace, in a scratch directory (what
they write stays there); blocks fenced ```` ```py ```` are shown, not run (code for the reader's
own checkpoint or files).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    run_blocks(REPO / "README.md", tmp_path, monkeypatch)


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
