"""Every relative link in README.md and docs/*.md resolves inside the repository.

A link's file must exist and lie inside the repository, and a link's
``#anchor`` must name a heading of the target page (GitHub's slugs). Links
to web addresses are not followed; links inside fenced code blocks are not
links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines of a markdown page outside fenced code blocks."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page's headings define (repeated headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m is None:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(page: Path) -> list[str]:
    """The targets of a page's markdown links, outside code blocks and code spans."""
    targets: list[str] = []
    for line in _prose(page.read_text(encoding="utf-8")):
        targets.extend(LINK.findall(re.sub(r"`[^`]*`", "", line)))
    return targets


def problems(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with a page's relative links; empty when every one resolves."""
    found: list[str] = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:: not followed
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(root.resolve()):
            found.append(f"{target}: points outside the repository")
            continue
        if not dest.exists():
            found.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            found.append(f"{target}: {dest.name} has no heading #{anchor}")
    return found


def test_the_pages_exist() -> None:
    assert (ROOT / "README.md").exists()
    names = {p.name for p in PAGES}
    assert {"architecture.md", "usage.md", "results.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert problems(page) == []


def test_the_checker_catches_broken_links(tmp_path: Path) -> None:
    page = ROOT / "docs" / "usage.md"
    assert "the-demo" in anchors(page)
    assert _slug("The way to 75%") == "the-way-to-75"
    assert _slug("Data-free learning (DIET)") == "data-free-learning-diet"
    assert _slug("The gateway, the dashboard and the clients") == (
        "the-gateway-the-dashboard-and-the-clients"
    )
    broken = tmp_path / "broken.md"
    broken.write_text(
        "[a](missing.md) [b](#nowhere) [c](https://example.org) `[f](span.md)`\n"
        "```\n[d](inside-code.md)\n```\n# Here\n[e](#here) [g](../outside.md)\n",
        encoding="utf-8",
    )
    assert links(broken) == [
        "missing.md",
        "#nowhere",
        "https://example.org",
        "#here",
        "../outside.md",
    ]
    assert problems(broken, root=tmp_path) == [
        "missing.md: no such file",
        "#nowhere: broken.md has no heading #nowhere",
        "../outside.md: points outside the repository",
    ]
