"""The pages link up: every relative Markdown link in README.md and docs/*.md names a file
that exists and, with a ``#fragment``, a heading of that file (as GitHub makes its anchors).
And the README stays a landing page: at most ~200 lines, and exactly two commands for a
newcomer to run, ``make run`` and ``make test``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans (no links there)."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The fragments GitHub gives the headings of ``page``: lower case, punctuation but
    ``-`` and ``_`` dropped, spaces to ``-``, a repeated one suffixed ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        heading = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_anchor_rule_is_githubs() -> None:
    page = ROOT / "docs" / "security.md"
    assert "trust-model-who-may-connect-and-which-tenants-it-may-name" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and (file.suffix != ".md" or fragment not in anchors(file)):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    assert not broken, broken


def test_the_readme_links_to_every_docs_page_it_maps() -> None:
    linked = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    for name in ("configuration", "guarantees", "security", "postgresql", "operations"):
        assert f"docs/{name}.md" in linked
    assert {"docs/benchmarks.md", "docs/PROTOCOL.md", "docs/ARCHITECTURE.md"} <= linked


def test_the_readme_is_a_landing_page_with_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    commands = [body.strip() for lang, body in blocks if lang != "python"]
    assert commands == ["make run", "make test"]
    assert [lang for lang, _ in blocks].count("python") == 1  # the worker tests/ runs
