"""Hypothesis strategies for hostile text: Unicode line and paragraph separators, control
characters, a byte-order mark, CR, tabs, combining marks, emoji, invalid UTF-8 (lone
continuation bytes, surrogates encoded as bytes, overlong forms, truncated sequences),
very long lines and empty lines."""
from __future__ import annotations

from hypothesis import strategies as st

WORDS = ["red", "dog", "runs", "the", "big", "cat", "Grüße", "Straße", "«Café»", "€"]
ODD_CHARS = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x00", "\x1b", "\x7f",
             "\r", "\t", "\ufeff", "\u200b", "\u0301", "\U0001F600", "\uFFFD", "\uE000", "\U0010FFFF", " ", "  "]
BAD_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf", b"\xe2\x82",
            b"\xf4\x90\x80\x80"]

# A line of text (no "\n"): real words, odd characters and arbitrary non-surrogate characters.
token = st.one_of(st.sampled_from(WORDS), st.sampled_from(ODD_CHARS),
                  st.characters(exclude_categories=("Cs",), exclude_characters="\n"))
line = st.lists(token, max_size=12).map(" ".join) | st.just("") | st.just("red dog " * 400)
lines = st.lists(line, max_size=6)

# Raw file content: encoded lines joined by LF / CRLF, maybe a BOM, maybe invalid bytes.
_piece = st.one_of(line.map(lambda s: s.encode("utf-8")), st.sampled_from(BAD_UTF8), st.sampled_from([b"\n", b"\r\n"]))
raw = st.builds(lambda bom, parts, nl: bom + b"".join(parts) + nl, st.sampled_from([b"", b"\xef\xbb\xbf"]),
                st.lists(_piece, max_size=12), st.sampled_from([b"", b"\n"]))
