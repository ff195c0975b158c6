"""The README's Python blocks run as written, and every relative link in the README and the docs
points at a file of the repository."""

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
    return re.findall(r"^```python\n(.*?)^```$", path.read_text(), flags=re.S | re.M)


def test_readme_python_blocks_run():
    blocks = python_blocks(REPO / "README.md")
    assert blocks, "the README has no Python block"
    namespace: dict = {}
    for block in blocks:  # one namespace: later blocks may use what earlier ones defined
        exec(compile(block, "README.md", "exec"), namespace)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    text = page.read_text()
    assert "../shared" not in text  # users have the repository only
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
