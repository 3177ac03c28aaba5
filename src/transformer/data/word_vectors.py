"""Pretrained word vectors (word2vec, GloVe) as the first rows of a subword embedding.

Formats, told apart by their content (a name ending in ``.gz`` is read through gzip):

    word2vec text    a first line ``count dim``, then ``word v1 ... v_dim`` a line
    word2vec binary  the same first line, then per word: the word, a space, ``dim`` float32
                     numbers (little-endian) and, as the C tool writes it, a newline
    GloVe text       ``word v1 ... v_dim`` a line, no header line

Matching: a piece is looked up as itself, then without sentencepiece's word-start mark
("▁word" matches "word"), then lower-cased (vectors of an uncased corpus, a cased vocabulary).

Size: vectors longer than d_model are reduced to their d_model principal directions (a
truncated SVD of the found vectors, uncentred): of all linear maps to d_model numbers it keeps
the dot products between the vectors best (Eckart-Young), and the tied output projection
scores words by dot product. Shorter vectors are mapped by a fixed random orthogonal matrix
(d_model x dim, seeded), which keeps every dot product exactly and spreads the words over all
d_model dimensions, as the random rows are, instead of leaving some dimensions zero.

Scale: the found rows are then scaled together (one factor, so their geometry is kept) to
the root mean square of the embedding's random initialisation, so that found and random rows
are the same size to the model; the rows of pieces the file lacks keep their random values.

Errors are ``ValueError`` (``FileNotFoundError`` for a missing file) with ``file:line`` (for a
binary file, the line is the header's 1 plus the record's number).
"""
from __future__ import annotations

import gzip
import zlib
from collections.abc import Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor, nn

WORD_START = "\u2581"  # sentencepiece's mark of a piece that begins a word
MAX_WORD_BYTES = 4096  # a binary record's word longer than this: not a word2vec binary file


@dataclass(frozen=True)
class Coverage:
    """How many of a vocabulary's pieces the vectors held (``str``: "5,123 of 8,000 pieces found (64.0%)")."""

    found: int
    total: int
    dim: int  # the file's vector size

    def __str__(self) -> str:
        share = 100.0 * self.found / self.total if self.total else 0.0
        return f"{self.found:,} of {self.total:,} pieces found ({share:.1f}%)"


def read_word_vectors(path: str | Path, keep: Container[str] | None = None) -> tuple[dict[str, Tensor], int]:
    """Read a word2vec (text or binary) or GloVe file, every line checked. Returns
    ({word: (dim,) float32 vector}, dim), holding only the words in ``keep`` when given
    (a large file need not fit in memory); a repeated word keeps its first vector."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: word-vector file not found")
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")) as f:
            first = f.readline()
            header = _header(first)
            if header is not None and _binary_follows(f):
                vectors, n = _read_binary(f, path, header[1], keep)
            else:
                vectors, n, dim = _read_text(f, path, first, header, keep)
                header = header or (n, dim)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: cannot read ({e})") from None
    count, dim = header
    if n == 0:
        raise ValueError(f"{path}: no vectors found")
    if n != count:
        raise ValueError(f"{path}: the header line says {count:,} vectors but the file holds {n:,}")
    return vectors, dim


def _header(line: bytes) -> tuple[int, int] | None:
    """``(count, dim)`` of a word2vec header line, None for a GloVe file (no header)."""
    parts = line.split()
    if len(parts) == 2 and all(p.isdigit() for p in parts) and int(parts[1]) > 0:
        return int(parts[0]), int(parts[1])
    return None


def _binary_follows(f: BinaryIO) -> bool:
    """Whether the records after the header are binary. A text line is UTF-8 without NUL;
    float32 numbers in bytes are almost never both (most hold a byte >= 0x80 or a 0)."""
    start = f.tell()
    line = f.readline()
    f.seek(start)
    try:
        return "\x00" in line.decode("utf-8")
    except UnicodeDecodeError:
        return True


def _vector(values: Sequence[str] | bytes, path: Path, lineno: int, dim: int) -> np.ndarray:
    try:
        if isinstance(values, bytes):
            vec = np.frombuffer(values, dtype="<f4")
        else:
            vec = np.asarray(values, dtype=np.float32)
    except ValueError:
        raise ValueError(f"{path}:{lineno}: expected a word followed by {dim} numbers") from None
    if len(vec) != dim:
        raise ValueError(f"{path}:{lineno}: {len(vec)} numbers, expected {dim}")
    if not np.isfinite(vec).all():
        raise ValueError(f"{path}:{lineno}: a number is not finite (nan or inf)")
    return vec


def _read_text(f: BinaryIO, path: Path, first: bytes, header: tuple[int, int] | None,
               keep: Container[str] | None) -> tuple[dict[str, Tensor], int, int]:
    """Text lines after the header (or from the first line, GloVe): (vectors, count, dim)."""
    vectors: dict[str, Tensor] = {}
    dim = header[1] if header else -1
    n = 0
    lines = f if header else _chain(first, f)
    for lineno, raw in enumerate(lines, 2 if header else 1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n").rstrip(" ")
        except UnicodeDecodeError:
            raise ValueError(f"{path}:{lineno}: not UTF-8 text") from None
        if not line:
            continue
        word, *values = line.split(" ")
        if dim < 0:
            dim = len(values)
            if dim == 0:
                raise ValueError(f"{path}:{lineno}: expected a word followed by numbers")
        vec = _vector(values, path, lineno, dim)
        n += 1
        if (keep is None or word in keep) and word not in vectors:
            vectors[word] = torch.from_numpy(vec.copy())
    return vectors, n, dim


def _chain(first: bytes, rest: BinaryIO):
    yield first
    yield from rest


def _read_binary(f: BinaryIO, path: Path, dim: int, keep: Container[str] | None) -> tuple[dict[str, Tensor], int]:
    """Binary records after the header, until the end of the file: (vectors, count)."""
    vectors: dict[str, Tensor] = {}
    n = 0
    while True:
        word = _binary_word(f, path, n + 2)
        if word is None:
            return vectors, n
        data = f.read(4 * dim)
        if len(data) < 4 * dim:
            raise ValueError(f"{path}:{n + 2}: the vector of {word!r} is cut short (truncated file?)")
        vec = _vector(data, path, n + 2, dim)
        n += 1
        if (keep is None or word in keep) and word not in vectors:
            vectors[word] = torch.from_numpy(vec.copy())


def _binary_word(f: BinaryIO, path: Path, lineno: int) -> str | None:
    """The word of the next record (up to its space), None at the end of the file."""
    word = bytearray()
    while True:
        c = f.read(1)
        if not c:
            if word.strip():
                raise ValueError(f"{path}:{lineno}: the file ends inside a word (truncated file?)")
            return None
        if c == b" " and word:
            return word.decode("utf-8", errors="replace")  # the C tool may cut a word inside a character
        if c != b"\n" or word:  # the newline that ends the record before
            word += c
        if len(word) > MAX_WORD_BYTES:
            raise ValueError(f"{path}:{lineno}: no space after a word within {MAX_WORD_BYTES} bytes; "
                             "not a word2vec binary file")


def candidates(piece: str) -> list[str]:
    """The words a piece may match, in order of preference."""
    word = piece[1:] if piece.startswith(WORD_START) else piece
    return [w for w in dict.fromkeys((piece, word, word.lower())) if w]


def match_pieces(vocab: Sequence[str | None], vectors: Container[str]) -> dict[int, str]:
    """{row: word} for the pieces of ``vocab`` (None: a special id, never matched) found."""
    rows = {}
    for i, piece in enumerate(vocab):
        if piece:
            word = next((w for w in candidates(piece) if w in vectors), None)
            if word is not None:
                rows[i] = word
    return rows


def fit_size(vectors: Tensor, d_model: int, seed: int = 0) -> Tensor:
    """(n, dim) vectors -> (n, d_model): the top principal directions when dim > d_model, a
    fixed random orthogonal map (seeded by ``seed``) when dim < d_model, as they are when equal
    (see the module's docstring for why)."""
    x = vectors.double()
    n, dim = x.shape
    if dim > d_model:
        _, _, vh = torch.linalg.svd(x, full_matrices=True)  # vh: (dim, dim), rows by singular value
        return (x @ vh[:d_model].T).float()
    if dim < d_model:
        gen = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(d_model, dim, generator=gen, dtype=torch.float64))  # (d_model, dim)
        return (x @ q.T).float()
    return x.float()


def _rms(t: Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt())


@torch.no_grad()
def init_from_word_vectors(embedding: nn.Module, path: str | Path, vocab: Sequence[str | None],
                           seed: int = 0) -> Coverage:
    """Set the rows of ``embedding`` (the model's token embedding, or any module with a
    (V, d_model) ``weight``) whose piece (``vocab[i]``; None for a special id) the file holds:
    matched, sized to d_model and scaled as the module's docstring says. Rows of pieces the
    file lacks keep their values. Returns how many pieces were found."""
    total = sum(1 for p in vocab if p)
    keep = {w for p in vocab if p for w in candidates(p)}
    vectors, dim = read_word_vectors(path, keep)
    rows = match_pieces(vocab[: embedding.weight.size(0)], vectors)
    if rows:
        found = fit_size(torch.stack([vectors[w] for w in rows.values()]), embedding.weight.size(1), seed)
        scale = _rms(embedding.weight) / max(_rms(found), 1e-12)
        embedding.weight[list(rows)] = (found * scale).to(embedding.weight.dtype)
    return Coverage(len(rows), total, dim)
