"""Pretrained word vectors: the three file formats read from small hand-made files, their
errors (file:line), matching subword pieces to words, coverage, sizing to d_model and the
rows they set in an embedding."""
from __future__ import annotations

import gzip
import struct

import pytest
import torch

from transformer.model.embedding import TokenEmbedding
from transformer.data.word_vectors import (
    Coverage,
    candidates,
    fit_size,
    init_from_word_vectors,
    match_pieces,
    read_word_vectors,
)

WORDS = {"cat": [1.0, 2.0, 3.0], "dog": [-1.0, 0.5, 0.0], "Zebra": [0.25, -0.25, 4.0]}


def text_lines(words=WORDS) -> str:
    return "".join(f"{w} {' '.join(repr(x) for x in v)}\n" for w, v in words.items())


def write_glove(path, words=WORDS):
    path.write_text(text_lines(words), encoding="utf-8")
    return path


def write_w2v_text(path, words=WORDS):
    path.write_text(f"{len(words)} 3\n" + text_lines(words), encoding="utf-8")
    return path


def write_w2v_binary(path, words=WORDS, newline=True):
    """The C tool's layout: header, then word, space, float32 x dim (little-endian), newline."""
    body = b"".join(w.encode() + b" " + struct.pack("<3f", *v) + (b"\n" if newline else b"")
                    for w, v in words.items())
    path.write_bytes(f"{len(words)} 3\n".encode() + body)
    return path


def as_lists(vectors):
    return {w: v.tolist() for w, v in vectors.items()}


@pytest.mark.parametrize("writer", [write_glove, write_w2v_text, write_w2v_binary,
                                    lambda p: write_w2v_binary(p, newline=False)],
                         ids=["glove", "word2vec-text", "word2vec-binary", "word2vec-binary-no-newlines"])
def test_every_format_reads_the_same_vectors(tmp_path, writer):
    vectors, dim = read_word_vectors(writer(tmp_path / "vectors"))
    assert dim == 3
    assert as_lists(vectors) == WORDS  # 1, 2, 0.5, 0.25 ... are exact in float32


def test_gzip_and_windows_line_ends(tmp_path):
    path = tmp_path / "vectors.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write(text_lines().replace("\n", "\r\n").encode())
    assert as_lists(read_word_vectors(path)[0]) == WORDS


def test_keep_holds_only_the_wanted_words_and_a_repeated_word_keeps_its_first_vector(tmp_path):
    path = write_glove(tmp_path / "v.txt", {**WORDS})
    path.write_text(path.read_text() + "cat 9 9 9\n")
    vectors, _ = read_word_vectors(path, keep={"cat", "emu"})
    assert as_lists(vectors) == {"cat": [1.0, 2.0, 3.0]}


@pytest.mark.parametrize("name,content,message", [
    ("ragged.txt", "a 1 2 3\nb 1 2\n", r"ragged\.txt:2: 2 numbers, expected 3"),
    ("words.txt", "a 1 2\nb x 3\n", r"words\.txt:2: expected a word followed by 2 numbers"),
    ("nan.txt", "1 2\na 1 nan\n", r"nan\.txt:2: a number is not finite"),
    ("word-only.txt", "a\n", r"word-only\.txt:1: expected a word followed by numbers"),
    ("count.txt", "3 2\na 1 2\nb 3 4\n", r"count\.txt: the header line says 3 vectors but the file holds 2"),
    ("empty.txt", "", r"empty\.txt: no vectors found"),
    ("latin1.txt", b"a 1 2\n\xe9t\xe9 1 2\n", r"latin1\.txt:2: not UTF-8 text"),
])
def test_malformed_text_files_name_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message):
        read_word_vectors(path)


def test_malformed_binary_files_name_the_record(tmp_path):
    whole = write_w2v_binary(tmp_path / "whole.bin").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(whole[:-6])  # into the third record's vector
    with pytest.raises(ValueError, match=r"cut\.bin:4: the vector of 'Zebra' is cut short"):
        read_word_vectors(cut)
    short = tmp_path / "short.bin"
    short.write_bytes(whole.replace(b"3 3\n", b"4 3\n", 1))
    with pytest.raises(ValueError, match=r"short\.bin: the header line says 4 vectors but the file holds 3"):
        read_word_vectors(short)
    bad = tmp_path / "inf.bin"
    bad.write_bytes(b"1 3\nx " + struct.pack("<3f", 1.0, float("inf"), 0.0))
    with pytest.raises(ValueError, match=r"inf\.bin:2: a number is not finite"):
        read_word_vectors(bad)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nowhere.vec"):
        read_word_vectors("nowhere.vec")


def test_pieces_match_with_and_without_the_word_start_mark_then_lower_case():
    assert candidates("\u2581Dog") == ["\u2581Dog", "Dog", "dog"]
    assert candidates("ing") == ["ing"]
    assert candidates("\u2581") == ["\u2581"]
    vocab = [None, None, "\u2581cat", "cat", "\u2581Dog", "\u2581emu", "\u2581", "Zebra", "\u2581zebra"]
    rows = match_pieces(vocab, {"cat": 0, "dog": 0, "Zebra": 0, "\u2581cat": 0})
    # the exact piece first; a special id (None) and a piece the file lacks stay unmatched
    assert rows == {2: "\u2581cat", 3: "cat", 4: "dog", 7: "Zebra"}


def test_coverage_reads_as_the_log_line():
    assert str(Coverage(5123, 8000, 300)) == "5,123 of 8,000 pieces found (64.0%)"
    assert str(Coverage(0, 0, 3)) == "0 of 0 pieces found (0.0%)"


@pytest.mark.parametrize("dim", [300, 128, 50])
def test_fit_size_gives_d_model_columns(dim):
    x = torch.randn(200, dim, generator=torch.Generator().manual_seed(0))
    assert fit_size(x, 128).shape == (200, 128)


def test_a_shorter_vector_keeps_every_dot_product_and_the_map_is_fixed():
    x = torch.randn(40, 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = fit_size(x, 64, seed=3).double()
    torch.testing.assert_close(y @ y.T, x @ x.T, rtol=1e-5, atol=1e-4)
    assert torch.equal(fit_size(x, 64, seed=3), fit_size(x, 64, seed=3))
    assert not torch.equal(fit_size(x, 64, seed=3), fit_size(x, 64, seed=4))


def test_a_longer_vector_keeps_its_top_principal_directions():
    """Vectors that span only 8 of their 30 dimensions lose nothing on the way to 16."""
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(50, 8, generator=gen) @ torch.randn(8, 30, generator=gen)).double()
    y = fit_size(x, 16).double()
    torch.testing.assert_close(y @ y.T, x @ x.T, rtol=1e-4, atol=1e-3)
    # with more directions than d_model, the 16 kept carry the most of the squared length
    z = torch.randn(50, 30, generator=gen, dtype=torch.float64)
    s = torch.linalg.svdvals(z)
    assert fit_size(z, 16).double().pow(2).sum().item() == pytest.approx(s[:16].pow(2).sum().item(), rel=1e-4)


VOCAB = [None, None, None, None, "\u2581cat", "\u2581Dog", "\u2581Zebra", "\u2581emu", "s"]


def test_found_rows_are_set_sized_and_scaled_the_rest_untouched(tmp_path):
    torch.manual_seed(0)
    emb = TokenEmbedding(vocab_size=len(VOCAB), d_model=3, pad_id=0)
    before = emb.weight.detach().clone()
    coverage = init_from_word_vectors(emb, write_w2v_text(tmp_path / "v.txt"), VOCAB)
    assert coverage == Coverage(found=3, total=5, dim=3)  # cat, Dog (as dog), Zebra; not emu or s
    found = emb.weight.detach()[[4, 5, 6]].double()
    vectors = torch.tensor([WORDS["cat"], WORDS["dog"], WORDS["Zebra"]], dtype=torch.float64)
    # one factor for all found rows: their geometry is the vectors', their size the random rows'
    scale = found.norm() / vectors.norm()
    torch.testing.assert_close(found, vectors * scale)
    assert found.pow(2).mean().sqrt().item() == pytest.approx(before.double().pow(2).mean().sqrt().item(), rel=1e-5)
    untouched = [0, 1, 2, 3, 7, 8]
    assert torch.equal(emb.weight[untouched], before[untouched])


def test_no_piece_found_changes_nothing(tmp_path):
    emb = TokenEmbedding(vocab_size=3, d_model=3, pad_id=0)
    before = emb.weight.detach().clone()
    assert init_from_word_vectors(emb, write_glove(tmp_path / "v.txt"), [None, "\u2581emu", "\u2581gnu"]).found == 0
    assert torch.equal(emb.weight, before)


def test_a_tied_model_shares_the_initialised_matrix(tmp_path, make_model):
    model = make_model(vocab_size=len(VOCAB), d_model=4, n_heads=2)
    init_from_word_vectors(model.src_embed, write_glove(tmp_path / "v.txt"), VOCAB)
    cat = model.src_embed.weight[4].detach().clone()
    assert model.tgt_embed.weight is model.src_embed.weight
    torch.testing.assert_close(model.tgt_embed(torch.tensor([4])), cat[None] * 2.0)  # sqrt(d_model) = 2
