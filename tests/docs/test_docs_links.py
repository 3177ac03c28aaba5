"""Every relative link in README.md and docs/*.md points to a file or folder that exists
(web addresses and links within a page are not checked; code blocks are not read)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(text: str) -> list[str]:
    """The targets of the page's links and images that name a file, without their #anchor."""
    text = CODE.sub("", FENCE.sub("", text))
    found = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # https:, mailto:, ... or a place on the same page
        found.append(target.split("#", 1)[0].split("?", 1)[0])
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_files_that_exist(page):
    missing = [t for t in relative_links(page.read_text(encoding="utf-8")) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to files that do not exist: {missing}"


def test_the_link_reader():
    page = ("[a](docs/x.md) ![img](images/a.png) [web](https://example.org/y) [here](#results)\n"
            "[anchor](benchmarks/README.md#speed) [titled](a.md \"title\") `[code](no.md)`\n"
            "```\n[block](no-either.md)\n```\n[[nested] text](b.md)\n")
    assert relative_links(page) == ["docs/x.md", "images/a.png", "benchmarks/README.md", "a.md", "b.md"]
