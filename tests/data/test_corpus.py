"""Reading parallel text: line splitting, gzip, encodings and the error messages users see."""

import gzip

import pytest

from transformer.data import clean_pairs, count_lines, iter_lines, open_lines, read_lines, read_parallel, read_tsv
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


@pytest.mark.parametrize("data, says", [
    ("hello\nworld\n".encode("utf-16"), ":1: invalid UTF-8 (byte 0xff at byte column 1): UTF-16 text (it starts "
                                          "with UTF-16's byte-order mark); convert the file to UTF-8, e.g. "
                                          "`iconv -f utf-16 -t utf-8`"),
    (b"text\n\x93\x00\x00\x01PK\x03", ":2: invalid UTF-8 (byte 0x93 at byte column 1): binary data (NUL bytes), "
                                      "not text; give a UTF-8 text file"),
])
def test_utf16_and_binary_files_say_what_they_are(tmp_path, data, says):
    """Neither is Latin-1, as the usual advice (`iconv -f latin1`) assumes: a UTF-16 file
    converts from UTF-16, a binary file is no text. Read whole or line by line alike."""
    path = tmp_path / "file.txt"
    path.write_bytes(data)
    with pytest.raises(UserError) as whole:
        read_lines(path)
    with pytest.raises(UserError) as streamed:
        _streamed(path)
    assert str(whole.value) == str(streamed.value) == f"{path}{says}"


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


# ---- the streamed reader (translate's input): the same lines and errors as read_lines -------

TRICKY = {
    "crlf-no-final-newline": b"one\r\n\r\nthree\r\nfour",
    "empty": b"",
    "one-newline": b"\n",
    "trailing-empty-line": b"a\n\n",
    "bom": "\ufeffHallo\nWelt\n".encode("utf-8"),
    "bom-then-newline": b"\xef\xbb\xbf\n",
    "bom-alone": b"\xef\xbb\xbf",
    "lone-cr": b"a\rb\nc\r",
    "unicode-breaks": "a\u2028b\nc\u2029d\ne\u0085f\ng\x0bh\n".encode("utf-8"),
    "multibyte": "Grüße aus Köln\nß\n日本語".encode("utf-8"),
}


def _streamed(path):
    with open_lines(path) as lines:
        return list(lines)


@pytest.mark.parametrize("name", list(TRICKY))
def test_open_lines_reads_what_read_lines_reads(tmp_path, name):
    path, gz = tmp_path / "x.txt", tmp_path / "x.txt.gz"
    path.write_bytes(TRICKY[name])
    gz.write_bytes(gzip.compress(TRICKY[name]))
    assert _streamed(path) == read_lines(path)
    assert _streamed(gz) == read_lines(gz)
    if name != "bom-alone":  # the one file whose count (1) is not its number of lines (0)
        assert count_lines(path) == count_lines(gz) == len(read_lines(path))


@pytest.mark.parametrize("data", [b"ok\nstill ok\nK\xf6ln\n", b"\xff", b"a\nb\ncaf\xc3\nd\n",
                                  b"\xef\xbb\xbfab\xe9\n"])
def test_open_lines_invalid_utf8_same_message(tmp_path, data):
    """The same one-line message, file:line and byte column, as the whole-file reader."""
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    with pytest.raises(UserError) as whole:
        read_lines(path)
    with pytest.raises(UserError) as streamed:
        _streamed(path)
    assert str(streamed.value) == str(whole.value)
    assert f"{path}:" in str(streamed.value) and "\n" not in str(streamed.value)


def test_open_lines_reads_lazily(tmp_path):
    """Lines before a bad one come out before the error: the file is not read whole first."""
    path = tmp_path / "late.txt"
    path.write_bytes(b"one\ntwo\nK\xf6ln\n")
    got = []
    with pytest.raises(UserError, match="late.txt:3:"):
        with open_lines(path) as lines:
            for line in lines:
                got.append(line)
    assert got == ["one", "two"]


def test_open_lines_bad_files(tmp_path):
    (tmp_path / "fake.gz").write_bytes(b"plain text\n")
    with pytest.raises(UserError, match="fake.gz.*gzip"):
        _streamed(tmp_path / "fake.gz")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"a line\n" * 1000)[:-20])
    with pytest.raises(UserError, match="cut.gz.*gzip"):
        _streamed(tmp_path / "cut.gz")
    with pytest.raises(UserError, match="nope.txt.*not found"):
        _streamed(tmp_path / "nope.txt")
    with pytest.raises(UserError, match="directory"):
        _streamed(tmp_path)
    with pytest.raises(UserError, match="nope.txt.*not found"):
        count_lines(tmp_path / "nope.txt")


def test_iter_lines_names_the_stream():
    assert list(iter_lines([b"a\r\n", b"b"], "<stdin>")) == ["a", "b"]
    with pytest.raises(UserError, match="<stdin>:2: invalid UTF-8"):
        list(iter_lines([b"a\n", b"\xfe\n"], "<stdin>"))
