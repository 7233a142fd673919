"""The project's docs stand alone: every relative link in README.md and docs/*.md reaches a file (and, with a
``#fragment``, a heading) that exists, and no file points to notes that live outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

#: notes that were never part of the repository; the docs that replace them are docs/method.md and docs/alignment.md
OUTSIDE_NOTES = ("fedvlr-method.md", "alignment-methods.md", "ecosystem-notes.md", "shared/docs")
SOURCE_DIRS = ("fedvlr_plus", "adapters", "datasets", "examples", "tests")
#: files exempt from the check (none: every file is checked)
BEING_MOVED: set[str] = set()

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (inline code marks too), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def relative_links(page: Path):
    for n, line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            yield n, target


def test_the_pages_exist():
    assert all(page.is_file() for page in PAGES)
    assert (ROOT / "docs" / "method.md").is_file() and (ROOT / "docs" / "alignment.md").is_file()
    assert len(PAGES) > 3


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_reach_a_file_and_heading(page):
    broken = []
    for n, target in relative_links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{where} (no heading #{fragment} in {dest.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def checked_files() -> list[Path]:
    files = [*PAGES, ROOT / "pyproject.toml"]
    for d in SOURCE_DIRS:
        for f in sorted((ROOT / d).rglob("*")):
            rel = f.relative_to(ROOT).as_posix()
            if (
                f.is_file()
                and f.suffix in (".py", ".md", ".toml", ".json", ".txt")
                and rel not in BEING_MOVED
                and f != Path(__file__).resolve()
                and "__pycache__" not in f.parts
            ):
                files.append(f)
    return files


def test_no_file_points_outside_the_repository():
    hits = []
    for f in checked_files():
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            hits += [f"{f.relative_to(ROOT)}:{n}: {name}" for name in OUTSIDE_NOTES if name in line]
    assert not hits, "pointers to notes outside the repository:\n" + "\n".join(hits)


def test_the_checks_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A `code` heading: here\n\n[ok](page.md#a-code-heading-here) [bad](missing.md)\n"
        "```\n[in code](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"a-code-heading-here"}
    assert [t for _, t in relative_links(page)] == ["page.md#a-code-heading-here", "missing.md"]
