"""The encoder-decoder's training forward under torch.compile: one graph (no break on data-
dependent branches or on the eager dropout's in-place random numbers), the eager numbers
without dropout, and real dropout with it."""
from __future__ import annotations

import torch


def test_the_training_forward_compiles_to_one_graph_with_the_eager_numbers(make_model, rand_tokens):
    model = make_model(seed=0, dropout=0.0).train()
    src = rand_tokens([6, 3, 5], width=6)  # padded sources: the mask is applied
    tgt = rand_tokens([4, 5, 2], width=5)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)  # fullgraph: a break is an error
    torch.testing.assert_close(compiled(src, tgt), model(src, tgt), rtol=1e-4, atol=1e-4)
    logits = compiled(src, tgt)
    logits.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_compiled_dropout_drops_about_p_and_keeps_the_expectation():
    from transformer.model.dropout import Dropout

    drop = Dropout(0.25).train()
    x = torch.ones(200, 500)
    y = torch.compile(drop, fullgraph=True)(x)
    dropped = (y == 0).float().mean().item()
    assert 0.24 < dropped < 0.26
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75))
    assert not torch.equal(y, torch.compile(drop, fullgraph=True)(x))  # a fresh mask each call
