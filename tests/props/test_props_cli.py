"""Random Unicode, invalid UTF-8, CRLF, U+2028, empty and very long lines through
`transformer translate` and `transformer evaluate` (in-process, on a tiny trained run):
each input either works (translate: one output line per input line, in input order) or
ends with a one-line error and exit code 2, never a traceback."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from props_helpers import PROPS, assert_works_or_one_line_error, run_cli
from props_strategies import line, lines, raw

from transformer.data import decode_lines
from transformer.errors import UserError

CANARY = "red dog runs with the big cat"
_n = itertools.count()


def _decoded(data: bytes) -> list[str] | None:
    try:
        return decode_lines(data, "x")
    except UserError:
        return None


def _check_translation(r, data: bytes) -> None:
    assert_works_or_one_line_error(r, "translate")
    want = _decoded(data)
    if want is None:
        assert r.code == 2 and "invalid UTF-8" in r.err
        return
    assert r.code == 0, r.err
    assert r.out.count("\n") == len(want)  # one line out per line in, even for U+2028, \r, \x0b ...
    outs = r.out.split("\n")[:-1] if want else []
    for src, out in zip(want, outs):
        if not src.strip():
            assert out == ""  # an empty line stays empty, in its place


@settings(PROPS, max_examples=15)
@given(data=raw, via=st.sampled_from(["stdin", "file"]))
def test_translate_any_bytes(trained_run, scratch, data, via):
    if via == "stdin":
        r = run_cli("translate", "--model", trained_run, "--beam", "1", stdin=data)
    else:
        path = scratch / f"in{next(_n)}.txt"
        path.write_bytes(data)
        r = run_cli("translate", "--model", trained_run, "--beam", "2", "--input", path)
    _check_translation(r, data)


@settings(PROPS, max_examples=10)
@given(text=lines, where=st.lists(st.integers(0, 6), min_size=1, max_size=3))
def test_translate_keeps_input_order(trained_run, canary, text, where):
    """A known sentence dropped anywhere among hostile lines comes out, translated as when
    alone, at its own position (--max-tokens 1: a batch per line, so numerics cannot differ)."""
    text = list(text)
    for w in sorted(where):
        text.insert(min(w, len(text)), CANARY)
    data = "".join(x + "\n" for x in text).encode()
    r = run_cli("translate", "--model", trained_run, "--beam", "1", "--max-tokens", "1", stdin=data)
    _check_translation(r, data)
    outs = r.out.split("\n")[:-1]
    for src, out in zip(text, outs):
        if src == CANARY:
            assert out == canary


@settings(PROPS, max_examples=12)
@given(src=raw, ref=raw, json=st.booleans())
def test_evaluate_any_bytes(trained_run, scratch, src, ref, json):
    assume(_decoded(src) != [] or _decoded(ref) != [])  # two empty files: see the xfail below
    k = next(_n)
    s, t = scratch / f"src{k}.txt", scratch / f"ref{k}.txt"
    s.write_bytes(src)
    t.write_bytes(ref)
    r = run_cli("evaluate", "--model", trained_run, "--src", s, "--ref", t, "--beam", "1",
                *(["--json"] if json else []))
    assert_works_or_one_line_error(r, "evaluate")
    a, b = _decoded(src), _decoded(ref)
    if a is None or b is None:
        assert r.code == 2 and "invalid UTF-8" in r.err
    elif len(a) != len(b):
        assert r.code == 2 and "must be aligned" in r.err
    else:
        assert r.code == 0, r.err
        assert ("BLEU" in r.out) or ('"bleu"' in r.out.lower())


@settings(PROPS, max_examples=8)
@given(src=st.lists(line, min_size=1, max_size=4))
def test_evaluate_same_line_counts_always_scores(trained_run, scratch, src):
    """Aligned files of any valid text (empty, control characters, U+2028) always score."""
    k = next(_n)
    s, t = scratch / f"s{k}.txt", scratch / f"t{k}.txt"
    s.write_text("".join(x + "\n" for x in src), encoding="utf-8")
    t.write_text("".join(x[::-1] + "\n" for x in src), encoding="utf-8")
    r = run_cli("evaluate", "--model", trained_run, "--src", s, "--ref", t, "--beam", "1", "--json")
    assert r.code == 0, r.err
    assert "Traceback" not in r.err


def test_evaluate_two_empty_files(trained_run, scratch):
    s, t = scratch / "empty.src", scratch / "empty.ref"
    s.write_bytes(b"")
    t.write_bytes(b"")
    r = run_cli("evaluate", "--model", trained_run, "--src", s, "--ref", t, "--beam", "1")
    assert r.code == 2 and "no sentences to score" in r.err
    assert_works_or_one_line_error(r, "evaluate")
