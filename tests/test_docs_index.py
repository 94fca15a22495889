"""docs/README.md is the index of the documentation: it links every document under docs/ (a new
one fails here until it is listed), every link in it resolves, and the README links the index."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def links(path: Path) -> set[str]:
    return {target.split("#", 1)[0] for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text())}


def test_the_index_lists_every_document() -> None:
    listed = links(DOCS / "README.md")
    documents = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert documents <= listed, f"documents the index does not list: {sorted(documents - listed)}"
    assert "architecture.md" in listed


def test_every_link_in_the_index_resolves() -> None:
    for target in links(DOCS / "README.md"):
        if "://" not in target:
            assert (DOCS / target).resolve().is_file(), target


def test_the_readme_links_the_index() -> None:
    assert "docs/README.md" in links(ROOT / "README.md")
