"""Random Unicode and invalid bytes at the data layer: reading files, pairing them,
subword encoding and decoding, token batching. Every input either works as documented or
raises a UserError with a one-line message; nothing else escapes."""
from __future__ import annotations

import gzip
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from props_helpers import PROPS
from props_strategies import ODD_CHARS, WORDS, line, lines, raw

from transformer.data import (
    TokenBatchSampler,
    collate,
    example_lengths,
    filter_long,
    read_lines,
    read_parallel,
    read_tsv,
)
from transformer.errors import UserError

_n = itertools.count()


def _write(scratch, data: bytes, suffix: str = ".txt"):
    path = scratch / f"f{next(_n)}{suffix}"
    path.write_bytes(gzip.compress(data) if suffix == ".gz" else data)
    return path


def _expected(data: bytes) -> list[str] | None:
    """The documented reading: UTF-8, BOM dropped, split on "\\n" only, one CR per line end."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.removeprefix("\ufeff")
    if not text:
        return []
    out = text.split("\n")
    if text.endswith("\n"):
        out.pop()
    return [x[:-1] if x.endswith("\r") else x for x in out]


@PROPS
@given(data=raw, suffix=st.sampled_from([".txt", ".gz"]))
def test_read_lines_reads_or_names_the_bad_byte(scratch, data, suffix):
    path = _write(scratch, data, suffix)
    want = _expected(data)
    if want is None:
        with pytest.raises(UserError) as e:
            read_lines(path)
        msg = str(e.value)
        assert "\n" not in msg and f"{path}:" in msg and "invalid UTF-8" in msg
    else:
        assert read_lines(path) == want  # U+2028, U+0085, \x0b ... stay inside their line


@PROPS
@given(data=st.binary(max_size=200))
def test_random_bytes_named_gz_are_a_user_error(scratch, data):
    path = _write(scratch, data, ".txt")
    gz = path.rename(path.with_suffix(".gz"))
    try:
        read_lines(gz)
    except UserError as e:
        assert "\n" not in str(e) and str(gz) in str(e)


@PROPS
@given(src=lines, tgt=lines)
def test_read_parallel_pairs_or_refuses_mismatched_files(scratch, src, tgt):
    a = _write(scratch, "".join(x + "\n" for x in src).encode())
    b = _write(scratch, "".join(x + "\n" for x in tgt).encode())
    want_src, want_tgt = _expected(a.read_bytes()), _expected(b.read_bytes())
    if len(want_src) == len(want_tgt):
        assert read_parallel(a, b) == list(zip(want_src, want_tgt))
    else:
        with pytest.raises(UserError) as e:
            read_parallel(a, b)
        msg = str(e.value)
        assert str(a) in msg and str(b) in msg and f"{len(want_src)} lines" in msg and "\n" not in msg


@PROPS
@given(rows=st.lists(st.lists(line, min_size=1, max_size=3).map("\t".join), max_size=6))
def test_read_tsv_pairs_or_names_the_line(scratch, rows):
    path = _write(scratch, "".join(r + "\n" for r in rows).encode())
    got_lines = _expected(path.read_bytes())
    bad = [i for i, x in enumerate(got_lines, 1) if x.count("\t") != 1]
    if not bad:
        assert read_tsv(path) == [tuple(x.split("\t")) for x in got_lines]
    else:
        with pytest.raises(UserError, match=f"{path}:{bad[0]}: expected exactly one tab"):
            read_tsv(path)


@PROPS
@given(text=line)
def test_subwords_encode_anything_decode_to_text(subwords, text):
    ids = subwords.encode(text)
    assert all(isinstance(i, int) and 0 <= i < subwords.vocab_size for i in ids)
    assert not {subwords.pad_id, subwords.bos_id, subwords.eos_id} & set(ids)
    assert isinstance(subwords.decode(ids), str)


@PROPS
@given(text=st.lists(st.sampled_from(WORDS + [" ", "  ", ",", "."]), max_size=15).map("".join))
def test_subwords_round_trip_on_known_characters(subwords, text):
    assert subwords.decode(subwords.encode(text)) == text


@PROPS
@given(text=st.lists(st.sampled_from(ODD_CHARS + WORDS), max_size=10).map("".join))
def test_subwords_unknown_characters_never_break_alignment(subwords, text):
    """No character makes encode produce an id a batch could not hold, or decode a newline."""
    assert "\n" not in subwords.decode(subwords.encode(text))


@PROPS
@given(pairs=st.lists(st.tuples(line, line), max_size=30), max_tokens=st.integers(1, 300),
       shards=st.integers(1, 3), max_len=st.integers(2, 64))
def test_batches_of_any_text_are_well_formed(subwords, pairs, max_tokens, shards, max_len):
    examples, dropped = filter_long([(subwords.encode(s), subwords.encode(t)) for s, t in pairs], max_len)
    assert len(examples) + dropped == len(pairs)
    assert all(len(s) + 1 <= max_len and len(t) + 2 <= max_len for s, t in examples)
    lengths = example_lengths(examples)
    seen = []
    for k in range(shards):
        for idx in TokenBatchSampler(lengths, max_tokens, seed=1, num_shards=shards, shard_index=k):
            b = collate([examples[i] for i in idx], 0, 1, 2)
            assert b.src.shape[0] == b.tgt_in.shape[0] == len(idx)
            assert b.tgt_in.shape == b.tgt_out.shape
            assert b.n_tgt_tokens == sum(len(examples[i][1]) + 1 for i in idx)
            assert (b.tgt_in[:, 0] == 1).all() and ((b.src == 2).sum(1) >= 1).all()
            assert len(idx) == 1 or len(idx) * max(max(lengths[i]) for i in idx) <= max_tokens
            seen += idx
    # The shards split the epoch's batches (all but the last len % shards) without overlap.
    full = list(TokenBatchSampler(lengths, max_tokens, seed=1))
    usable = full[: len(full) - len(full) % shards]
    assert sorted(seen) == sorted(i for b in usable for i in b)
