"""Every relative link in README.md and docs/*.md points at a file inside the repository
(users have the repository, nothing beside it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or the closing paren
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    return LINK.findall(text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_repository(doc):
    bad = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same page
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            bad.append(f"{target} (missing)")
        elif REPO not in path.parents and path != REPO:
            bad.append(f"{target} (outside the repository)")
    assert not bad, f"{doc.relative_to(REPO)}: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_reference_to_files_beside_the_repository(doc):
    assert "../shared/" not in doc.read_text(encoding="utf-8")


def test_the_checker_sees_links():
    # a broken link must be found: the regular expression reads the forms the docs use
    assert LINK.findall('see [a](docs/x.md#y), ![b](img/c.png) and [c](e.md "title")') == \
        ["docs/x.md#y", "img/c.png", "e.md"]
