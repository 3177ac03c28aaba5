"""Fonts for subword labels in any script, without matplotlib's "missing glyph" warnings.

DejaVu Sans (shipped with matplotlib) covers Latin (umlauts, Czech háčeks), Greek and
Cyrillic. For other scripts (Chinese, Japanese, Arabic, ...) we look for an installed font
that has the glyphs and put it behind DejaVu Sans in matplotlib's per-glyph fallback list.
A character no installed font has is drawn as "□" (or by matplotlib's "Last Resort"
font, a box naming the Unicode block) instead of warning.
"""
from __future__ import annotations

from functools import lru_cache

PRIMARY = "DejaVu Sans"
MISSING = "\u25a1"  # □, which DejaVu Sans has


@lru_cache(maxsize=1)
def _charmaps() -> dict[str, frozenset[int]]:
    """{family name: code points it covers} for every font matplotlib knows, PRIMARY first."""
    from matplotlib import font_manager, ft2font

    maps: dict[str, frozenset[int]] = {}
    paths: dict[str, str] = {}
    for entry in font_manager.fontManager.ttflist:
        paths.setdefault(entry.name, entry.fname)
    primary = font_manager.findfont(PRIMARY, fallback_to_default=True)
    # Real fonts before "Last Resort" (it draws a placeholder box for every code point).
    ordered = sorted(paths.items(), key=lambda item: (item[0].startswith("Last Resort"), item[0]))
    for name, path in [(PRIMARY, primary), *ordered]:
        if name in maps:
            continue
        try:
            maps[name] = frozenset(ft2font.FT2Font(path).get_charmap())
        except (OSError, RuntimeError, ValueError):  # unreadable or unsupported font file
            continue
    return maps


def font_for(ch: str) -> str | None:
    """The first known family (PRIMARY preferred) that has a glyph for ``ch``."""
    code = ord(ch)
    for name, cmap in _charmaps().items():
        if code in cmap:
            return name
    return None


def families(texts: list[str]) -> list[str]:
    """The font fallback list that draws every character of ``texts``: PRIMARY, then one
    family per script not covered by it (in order of first need)."""
    chosen = [PRIMARY]
    primary = _charmaps().get(PRIMARY, frozenset())
    for text in texts:
        for ch in text:
            if ord(ch) in primary or not ch.isprintable():
                continue
            name = font_for(ch)
            if name is not None and name not in chosen:
                chosen.append(name)
    return chosen


def displayable(text: str) -> str:
    """``text`` as matplotlib can draw it: characters no font has become "□", and "$"
    is escaped so that a subword is never read as mathtext."""
    maps = _charmaps()
    out = []
    for ch in text:
        if not ch.isprintable():
            out.append(MISSING)
        elif any(ord(ch) in cmap for cmap in maps.values()):
            out.append(ch)
        else:
            out.append(MISSING)
    return "".join(out).replace("$", r"\$")
