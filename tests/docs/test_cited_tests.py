"""A test file that the docs or a benchmark page cite as where something is checked exists: a
reader who follows `tests/...py` from a page finds it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_cited_test_file_exists():
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").rglob("*.md")]
    missing = set()
    for page in pages:
        for path in re.findall(r"(?<![\w/.])(tests/[\w/]+\.py)", page.read_text(encoding="utf-8")):
            if not (ROOT / path).is_file():
                missing.add(f"{page.relative_to(ROOT)}: {path}")
    assert len(pages) > 10 and not missing, sorted(missing)
