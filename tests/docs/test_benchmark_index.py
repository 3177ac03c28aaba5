"""benchmarks/README.md is the one index of the measurements: every script under benchmarks/ is
named there (a new script without a figure or a use is noticed), every page it links opens a
"Current results" section, and every figure a row quotes is in that section of the page it
links (so the index cannot keep a figure that the page's history has replaced)."""
from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
INDEX = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+")  # a measured figure: a number with decimals


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def index_rows() -> list[tuple[str, list[Path]]]:
    """(the row's figure cell, the pages it links) for each row of the index's table."""
    rows = []
    for line in section(INDEX, "## Current results").splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) == 6 and not line.startswith("| figure "):
            rows.append((cells[1], [BENCHMARKS / p for p in re.findall(r"\]\(([^)#]+)", cells[4])]))
    return rows


def test_every_script_is_in_the_index():
    scripts = [p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*") if p.suffix in (".py", ".sh")]
    assert len(scripts) >= 20
    missing = [s for s in scripts if not re.search(rf"(?<![\w/])(?:benchmarks/)?{re.escape(s)}", INDEX)]
    assert not missing, f"name these in benchmarks/README.md (a figure's command or a helper): {missing}"


def test_every_row_links_a_page_with_current_results():
    rows = index_rows()
    assert len(rows) >= 20
    for figure, pages in rows:
        assert pages, f"a row links no page: {figure.strip()[:80]}"
        for page in pages:
            assert "## Current results" in page.read_text(encoding="utf-8"), page


def test_every_figure_is_in_a_linked_current_table():
    missing = []
    for figure, pages in index_rows():
        tables = "".join(section(p.read_text(encoding="utf-8"), "## Current results") for p in pages)
        for number in FIGURE.findall(figure):
            if not re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", tables):
                missing.append(f"{number}: {figure.strip()[:80]}")
    assert not missing, "\n".join(missing)
