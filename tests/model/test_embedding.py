"""Token embeddings and sinusoidal positions (section 3.5); word vectors: tests/data/test_word_vectors.py."""
from __future__ import annotations

import math

import pytest
import torch

from transformer.model.embedding import PositionalEncoding, TokenEmbedding, sinusoid_table


def paper_angle(pos: int, i: int, d_model: int) -> float:
    """pos / 10000^(2i / d_model), the argument of PE(pos, 2i) and PE(pos, 2i+1)."""
    return pos / 10000 ** (2 * i / d_model)


POINTS = [(0, 0), (1, 0), (1, 1), (7, 3), (50, 2), (99, 7)]  # (pos, i) with 2i < d_model = 16


@pytest.mark.parametrize("pos,i", POINTS)
def test_interleaved_table_is_the_papers_formula(pos, i):
    d = 16
    pe = sinusoid_table(100, d, "interleaved")
    assert pe.shape == (100, d) and pe.dtype == torch.float32
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(paper_angle(pos, i, d)), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(paper_angle(pos, i, d)), abs=1e-6)


@pytest.mark.parametrize("pos,i", POINTS)
def test_concat_table_is_the_same_values_sines_first(pos, i):
    d = 16
    pe = sinusoid_table(100, d, "concat")
    assert pe[pos, i].item() == pytest.approx(math.sin(paper_angle(pos, i, d)), abs=1e-6)
    assert pe[pos, d // 2 + i].item() == pytest.approx(math.cos(paper_angle(pos, i, d)), abs=1e-6)


def test_layouts_are_permutations_of_each_other():
    inter, concat = sinusoid_table(30, 8, "interleaved"), sinusoid_table(30, 8, "concat")
    perm = [0, 2, 4, 6, 1, 3, 5, 7]  # concat column j holds interleaved column perm[j]
    assert torch.equal(concat, inter[:, perm])
    assert not torch.equal(concat, inter)


def test_positional_encoding_adds_the_table_from_the_start_offset():
    pe = PositionalEncoding(d_model=8, max_len=20)
    x = torch.randn(2, 10, 8)
    full = pe(x)
    torch.testing.assert_close(full, x + sinusoid_table(20, 8)[:10])
    # decoding positions 4..6 one chunk later sees exactly the positions the full pass saw
    torch.testing.assert_close(pe(x[:, 4:7], start=4), full[:, 4:7], rtol=0, atol=0)
    assert not torch.allclose(pe(x[:, 4:7]), full[:, 4:7])  # without the offset it would differ


def test_too_long_input_is_a_clear_value_error():
    pe = PositionalEncoding(d_model=8, max_len=20)
    pe(torch.zeros(1, 20, 8))  # exactly max_len is fine
    with pytest.raises(ValueError, match="21 positions is longer than the model's max_len=20"):
        pe(torch.zeros(1, 21, 8))
    with pytest.raises(ValueError, match="max_len=20"):
        pe(torch.zeros(1, 3, 8), start=18)


def test_too_long_input_through_the_model(make_model):
    model = make_model(max_len=10)
    with pytest.raises(ValueError, match="max_len=10"):
        model.encode(torch.full((1, 11), 5))
    src = torch.full((1, 4), 5)
    cache = model.start_cache(model.encode(src), src)
    _, cache = model.decode(torch.full((1, 9), 5), cache)
    _, cache = model.decode(torch.full((1, 1), 5), cache)  # position 9: the last one
    with pytest.raises(ValueError, match="max_len=10"):
        model.decode(torch.full((1, 1), 5), cache)


def test_token_embedding_is_scaled_by_sqrt_d_model():
    emb = TokenEmbedding(vocab_size=7, d_model=16, pad_id=0)
    tokens = torch.tensor([[3, 0, 6], [1, 1, 2]])
    torch.testing.assert_close(emb(tokens), emb.weight[tokens] * 4.0)


def test_encode_and_decode_scale_the_embedding_exactly_once(make_model):
    model = make_model()
    src, tgt = torch.tensor([[5, 7, 3]]), torch.tensor([[1, 8]])
    pe = sinusoid_table(64, 16)
    x = model.src_embed.weight[src] * math.sqrt(16) + pe[:3]
    memory, _ = model.encoder(x, model.src_mask(src))
    torch.testing.assert_close(model.encode(src), memory)

    cache = model.start_cache(memory, src)
    y = model.tgt_embed.weight[tgt] * math.sqrt(16) + pe[:2]
    h, _, _ = model.decoder(y, cache)
    torch.testing.assert_close(model.decode(tgt, cache)[0], h @ model.tgt_embed.weight.T)
