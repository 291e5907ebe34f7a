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


ITEM = re.compile(r"^(\s*)(?:[-*]|\d+\.)\s")
LONGEST_ITEM = 20  # lines: a longer list item is a section in disguise


def _list_items(text: str):
    """(first line number, lines) of every Markdown list item outside code blocks."""
    lines = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text,
                   flags=re.S).splitlines()
    items, i = [], 0
    while i < len(lines):
        m = ITEM.match(lines[i])
        if not m:
            i += 1
            continue
        indent, j = len(m.group(1)), i + 1
        while j < len(lines):
            line = lines[j]
            if line.strip() and (len(line) - len(line.lstrip()) <= indent):
                break
            if not line.strip() and (j + 1 >= len(lines) or not lines[j + 1].startswith(
                    " " * (indent + 1))):
                break
            j += 1
        items.append((i + 1, j - i))
        i = j if j > i + 1 else i + 1
    return items


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_list_item_is_a_section_in_disguise(doc):
    long = [(n, size) for n, size in _list_items(doc.read_text(encoding="utf-8"))
            if size > LONGEST_ITEM]
    assert not long, f"{doc.relative_to(REPO)}: list items (line, lines): {long}"


def test_nothing_cites_a_file_that_is_not_in_the_repository():
    """The model is stated in docs/planner.md; MODEL.md lives beside the repository only."""
    files = [*DOCS, *(REPO / "models").glob("*/README.md"), *(REPO / "mgcaffe").rglob("*.py")]
    citing = [str(f.relative_to(REPO)) for f in files if "MODEL.md" in f.read_text("utf-8")]
    assert citing == []


def test_the_readme_python_example_uses_files_that_exist_or_make_demo_writes():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    paths = re.findall(r"\"([^\"]+\.(?:prototxt|caffemodel))\"", block)
    assert any(p.endswith(".caffemodel") for p in paths)
    solver = (REPO / "models" / "digits" / "solver.prototxt").read_text(encoding="utf-8")
    prefix = re.search(r'snapshot_prefix: "([^"]+)"', solver).group(1)
    max_iter = re.search(r"max_iter: (\d+)", solver).group(1)
    demo = (REPO / "tools" / "demo.py").read_text(encoding="utf-8")
    assert "models/digits/solver.prototxt" in demo
    for path in paths:
        if path.endswith(".caffemodel"):  # the full training make demo runs writes it
            assert path == f"{prefix}_iter_{max_iter}.caffemodel", path
        else:
            assert (REPO / path).is_file(), path
