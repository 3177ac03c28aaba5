"""Reading parallel text: plain or gzip files, one sentence per line, UTF-8.

Lines are split on "\\n" only. ``str.splitlines()`` would also break on U+2028, U+2029,
U+0085, \\x0b, \\x0c and \\x1c-\\x1e, which occur inside real sentences and would silently
misalign the two sides of a parallel corpus. One trailing "\\r" per line (CRLF files) is
removed; a leading byte-order mark is removed.

Every problem with the user's files raises :class:`~transformer.errors.UserError` with a
one-line message that names the file (and line) and says what to do.
"""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ..errors import UserError

__all__ = ["read_bytes", "read_lines", "open_lines", "iter_lines", "count_lines", "read_parallel", "read_tsv", "clean_pairs", "hold_out"]

_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise UserError(f"{path}: file not found; check the path")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a text file (one sentence per line)")


def _gzip_error(path: Path, e: Exception) -> UserError:
    return UserError(f"{path}: not a valid gzip file ({e}); re-download it or remove the .gz suffix")


@contextmanager
def _read_errors(path: Path) -> Iterator[None]:
    """Read errors (a damaged gzip stream, an OS error) as one-line UserErrors naming ``path``."""
    try:
        yield
    except _GZIP_ERRORS as e:
        raise _gzip_error(path, e) from e
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from e


def _open_binary(path: Path) -> BinaryIO:
    """The file opened for reading bytes, gunzipped when the name ends in ``.gz``."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when the name ends in ``.gz``; a missing file, a folder, a
    damaged gzip stream or a read error is a one-line UserError naming it."""
    _check_file(path)
    with _read_errors(path), _open_binary(path) as f:
        return f.read()


def _utf8_error(name: str, line: int, raw: bytes, column: int) -> UserError:
    """The error for line ``line`` (its bytes ``raw``), not UTF-8 at byte ``column`` (from 1).
    What to do depends on what the file is: UTF-16 text (a byte-order mark first) converts
    from UTF-16, binary data (a NUL byte in the line) is no text at all, anything else is most
    likely Latin-1 text."""
    bad = f"{name}:{line}: invalid UTF-8 (byte 0x{raw[column - 1]:02x} at byte column {column})"
    if line == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return UserError(f"{bad}: UTF-16 text (it starts with UTF-16's byte-order mark); convert the file to "
                         "UTF-8, e.g. `iconv -f utf-16 -t utf-8`")
    if b"\0" in raw:
        return UserError(f"{bad}: binary data (NUL bytes), not text; give a UTF-8 text file")
    return UserError(f"{bad}; convert the file to UTF-8, e.g. `iconv -f latin1 -t utf-8`")


def decode_lines(data: bytes, name: str) -> list[str]:
    """Split UTF-8 bytes into lines on "\\n" only; the final newline does not start an extra
    empty line, but empty lines inside are kept (they keep a corpus aligned). ``name``
    (a path, or "<stdin>") goes into the error message for invalid UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        start = data.rfind(b"\n", 0, e.start) + 1
        end = data.find(b"\n", e.start)
        raise _utf8_error(name, line, data[start:end if end >= 0 else len(data)], e.start - start + 1) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: str | Path) -> list[str]:
    """Read a UTF-8 text file (gzip if the name ends in ``.gz``) as a list of lines
    (see :func:`decode_lines`).

    Raises:
        UserError: the file is missing, is a directory, is not valid gzip, or is not
            valid UTF-8 (the message gives the 1-based line number).
    """
    path = Path(path)
    return decode_lines(read_bytes(path), str(path))


def iter_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """The lines of a binary stream one at a time, split and checked exactly as
    :func:`decode_lines` does for the whole of it (a UTF-8 sequence never holds the byte
    "\\n", so splitting before decoding changes nothing). ``raw_lines`` is what iterating a
    file opened in binary mode gives: pieces that end in b"\\n", but maybe the last."""
    for number, raw in enumerate(raw_lines, start=1):
        ended = raw.endswith(b"\n")
        try:
            line = (raw[:-1] if ended else raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _utf8_error(name, number, raw, e.start + 1) from None
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
            if not line and not ended:  # the file is a byte-order mark alone: no lines
                return
        yield line[:-1] if line.endswith("\r") else line


@contextmanager
def open_lines(path: str | Path) -> Iterator[Iterator[str]]:
    """Read a file as :func:`read_lines` does, one line at a time (memory bounded by the
    longest line): ``with open_lines(path) as lines: for line in lines: ...``.

    Raises:
        UserError: as :func:`read_lines`; a problem found part-way (invalid UTF-8, a damaged
            gzip stream) is raised when the reader gets there, naming the file and line.
    """
    path = Path(path)
    _check_file(path)
    with _read_errors(path):
        f = _open_binary(path)
    with f:
        yield _reading(iter_lines(f, str(path)), path)


def _reading(lines: Iterator[str], path: Path) -> Iterator[str]:
    """``lines``, with read errors turned into one-line UserErrors naming ``path``."""
    with _read_errors(path):
        yield from lines


def count_lines(path: str | Path, block: int = 1 << 20) -> int:
    """How many lines :func:`read_lines` would give (newlines counted block by block, no
    decoding: for a progress bar's total; a file that is only a byte-order mark counts 1)."""
    path = Path(path)
    _check_file(path)
    n, last = 0, b"\n"
    with _read_errors(path), _open_binary(path) as f:
        while data := f.read(block):
            n, last = n + data.count(b"\n"), data[-1:]
    return n + (last != b"\n")


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> list[tuple[str, str]]:
    """Read two line-aligned files as ``(source, target)`` pairs.

    Raises:
        UserError: the files have different line counts (both files and counts are named),
            or either file cannot be read (see :func:`read_lines`).
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(
            f"parallel files differ in length: {src_path} has {len(src)} lines but {tgt_path} "
            f"has {len(tgt)}; each line must hold one sentence and its translation"
        )
    return list(zip(src, tgt))


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """Read ``source<TAB>target`` lines as pairs.

    Raises:
        UserError: a line has no tab or more than one (names ``file:line``).
    """
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(
                f"{path}:{number}: expected exactly one tab between source and target, "
                f"found {len(fields) - 1}; fix or remove this line"
            )
        pairs.append((fields[0], fields[1]))
    return pairs


def clean_pairs(pairs: Iterable[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """Drop pairs whose source or target is empty or whitespace-only.

    Returns:
        ``(kept_pairs, n_skipped)``; the caller reports ``n_skipped``.
    """
    kept, skipped = [], 0
    for src, tgt in pairs:
        if src.strip() and tgt.strip():
            kept.append((src, tgt))
        else:
            skipped += 1
    return kept, skipped


def hold_out(pairs: list[tuple[str, str]], n: int, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split ``n`` pairs, drawn at random with ``seed``, off ``pairs``: returns ``(rest,
    held_out)``, both in their original order. The same pairs, n and seed give the same split.

    Raises:
        UserError: ``n`` would leave no pair to train on.
    """
    if n >= len(pairs):
        raise UserError(f"holding out {n} pairs for validation leaves none of the {len(pairs)} to train on; "
                        "lower valid_size or give valid_src/valid_tgt")
    chosen = set(random.Random(seed).sample(range(len(pairs)), n))
    rest = [p for i, p in enumerate(pairs) if i not in chosen]
    return rest, [p for i, p in enumerate(pairs) if i in chosen]
