"""Reading parallel text: line splitting, gzip, encodings and the error messages users see."""

import gzip

import pytest

from transformer.data import clean_pairs, read_lines, read_parallel, read_tsv
from transformer.errors import UserError


def test_splits_on_newline_only(tmp_path):
    # Each of these is a line break for str.splitlines() but not for a parallel corpus.
    odd = ["a\u2028b", "c\u2029d", "e\u0085f", "g\x0bh", "i\x0cj", "k\x1cl"]
    path = tmp_path / "odd.txt"
    path.write_bytes(("\n".join(odd) + "\n").encode("utf-8"))
    assert read_lines(path) == odd


def test_crlf_empty_lines_and_missing_final_newline(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"one\r\n\r\nthree\r\nfour")
    assert read_lines(path) == ["one", "", "three", "four"]
    (tmp_path / "empty.txt").write_bytes(b"")
    assert read_lines(tmp_path / "empty.txt") == []


def test_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffHallo\nWelt\n".encode("utf-8"))
    assert read_lines(path) == ["Hallo", "Welt"]


def test_gzip(tmp_path):
    path = tmp_path / "x.de.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("Grüße\u2028aus Köln\nß\n")
    assert read_lines(path) == ["Grüße\u2028aus Köln", "ß"]


def test_not_gzip_despite_suffix(tmp_path):
    path = tmp_path / "fake.gz"
    path.write_bytes(b"plain text\n")
    with pytest.raises(UserError, match="fake.gz.*gzip"):
        read_lines(path)


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\nstill ok\nK\xf6ln\n".encode("latin-1"))
    with pytest.raises(UserError) as err:
        read_lines(path)
    message = str(err.value)
    assert f"{path}:3:" in message and "UTF-8" in message and "iconv" in message
    assert "\n" not in message


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UserError, match="nope.txt.*not found"):
        read_lines(tmp_path / "nope.txt")
    with pytest.raises(UserError, match="directory"):
        read_lines(tmp_path)


def test_read_parallel_pairs_lines(tmp_path):
    (tmp_path / "a.en").write_text("a cat\na dog\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eine Katze\nein Hund\n", encoding="utf-8")
    assert read_parallel(tmp_path / "a.en", tmp_path / "a.de") == [("a cat", "eine Katze"), ("a dog", "ein Hund")]


def test_read_parallel_mismatched_counts_names_both(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("1\n2\n3\n", encoding="utf-8")
    tgt.write_text("1\n2\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        read_parallel(src, tgt)
    message = str(err.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "has 2" in message


def test_read_tsv(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("a cat\teine Katze\n\tleer\n", encoding="utf-8")
    assert read_tsv(path) == [("a cat", "eine Katze"), ("", "leer")]


@pytest.mark.parametrize("bad_line, tabs", [("no tab here", 0), ("a\tb\tc", 2)])
def test_read_tsv_rejects_wrong_tab_count(tmp_path, bad_line, tabs):
    path = tmp_path / "pairs.tsv"
    path.write_text(f"good\tgut\n{bad_line}\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"pairs\.tsv:2: .*found {tabs}"):
        read_tsv(path)


def test_clean_pairs_counts_skipped():
    pairs = [("a", "b"), ("", "b"), ("a", "  "), ("\t", "x"), ("c", "d"), ("", "")]
    kept, skipped = clean_pairs(pairs)
    assert kept == [("a", "b"), ("c", "d")]
    assert skipped == 4
