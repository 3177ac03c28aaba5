"""Every figure the README's results quote is in the current table of the benchmark page it links
to: a figure copied from a page's history, rounded, or left behind when the table moved on fails
here, naming the figure and the page."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+")  # a measured figure: a number with decimals


def current_section(page: Path) -> str:
    """The page's `## Current results` section (to the next `## ` heading)."""
    text = page.read_text(encoding="utf-8")
    start = text.index("## Current results")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def results_rows() -> list[tuple[str, Path]]:
    """(row, linked page) for each row of the README's result tables that links a page."""
    section = README[README.index("## Results"):]
    section = section[:section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        link = re.search(r"\]\((benchmarks/[^)#]+)", line)
        if line.startswith("|") and link:
            rows.append((line, ROOT / link[1]))
    return rows


def test_the_results_link_pages_with_a_current_table():
    rows = results_rows()
    assert len(rows) >= 10
    for _, page in rows:
        assert "## Current results" in page.read_text(encoding="utf-8"), page


def test_every_figure_is_in_the_linked_current_table():
    missing = []
    for row, page in results_rows():
        table = current_section(page)
        result = row.split("|")[2]  # | what | result | where measured |
        for figure in FIGURE.findall(result):
            if not re.search(rf"(?<![\d.]){re.escape(figure)}(?!\d)", table):
                missing.append(f"{figure} ({page.relative_to(ROOT)}): {result.strip()[:80]}")
    assert not missing, "\n".join(missing)
