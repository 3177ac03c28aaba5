"""The RNN encoder-decoder baseline: shapes, padding, parameter counts, and it can learn."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer.baselines.rnn import RNNSeq2Seq, hidden_size_for, recurrent_parameters

V = 13


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("attention", ["luong", None])
def test_shapes(cell, attention):
    torch.manual_seed(0)
    model = RNNSeq2Seq(V, d_emb=8, d_hidden=12, n_layers=2, cell=cell, attention=attention).eval()
    src = torch.randint(3, V, (3, 7))
    src[1, 4:] = 0  # padded sentence
    tgt_in = torch.randint(3, V, (3, 5))
    assert model(src, tgt_in).shape == (3, 5, V)
    memory, _ = model.encode(src)
    assert memory.shape == (3, 7, 12)
    out = model.greedy(src, max_len=6)
    assert len(out) == 3 and all(len(row) <= 6 for row in out)


@pytest.mark.parametrize("attention", ["luong", None])
def test_padding_does_not_change_a_sentence(attention):
    torch.manual_seed(0)
    model = RNNSeq2Seq(V, d_emb=8, d_hidden=12, cell="lstm", attention=attention).eval()
    src = torch.randint(3, V, (1, 5))
    tgt_in = torch.randint(3, V, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in), model(padded, tgt_in), atol=1e-6, rtol=0)


def test_parameter_count_formula_and_matching():
    for cell in ("lstm", "gru", "rnn"):
        rnn = RNNSeq2Seq(V, d_emb=8, d_hidden=12, n_layers=2, cell=cell, attention=None)
        assert sum(p.numel() for p in rnn.encoder.parameters()) == recurrent_parameters(8, 12, 2, cell)
    h = hidden_size_for(100_000, d_emb=32, n_layers=2, cell="lstm", attention="luong")
    model = RNNSeq2Seq(V, d_emb=32, d_hidden=h, n_layers=2, cell="lstm", attention="luong")
    body = model.num_parameters() - sum(p.numel() for m in (model.src_embed, model.tgt_embed, model.out)
                                        for p in m.parameters())
    assert body <= 100_000
    bigger = RNNSeq2Seq(V, d_emb=32, d_hidden=h + 1, n_layers=2, cell="lstm", attention="luong")
    assert bigger.num_parameters() - model.num_parameters() > 100_000 - body


@pytest.mark.parametrize("cell, attention", [("lstm", "luong"), ("lstm", None), ("rnn", None)])
def test_overfits_a_tiny_batch(cell, attention):
    """Four short sentences to reverse, learned to zero errors."""
    torch.manual_seed(0)
    model = RNNSeq2Seq(V, d_emb=16, d_hidden=32, cell=cell, attention=attention)
    src = torch.randint(3, V, (4, 5))
    tgt = src.flip(1)
    tgt_in = torch.cat([torch.ones(4, 1, dtype=torch.long), tgt], dim=1)
    tgt_out = torch.cat([tgt, torch.full((4, 1), 2)], dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05
    model.eval()
    assert model.greedy(src, max_len=8) == tgt.tolist()
