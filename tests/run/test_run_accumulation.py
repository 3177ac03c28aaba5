"""Gradient accumulation: an update over micro-batches equals the update over the same
sentences in one batch (the loss, label smoothing included, is normalised by the target
tokens of the whole update, and padding counts for nothing)."""
from __future__ import annotations

import copy

import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer.data import collate
from transformer.train.update import train_step


def _examples(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        s, t = torch.randint(2, 12, (2,), generator=g).tolist()
        out.append((torch.randint(4, 40, (s,), generator=g).tolist(), torch.randint(4, 40, (t,), generator=g).tolist()))
    return out


def _update(model, micro, epsilon):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    before = {k: v.clone() for k, v in m.named_parameters()}
    stats = train_step(m, micro, opt, lr=1.0, epsilon=epsilon).read()
    return stats, {k: before[k] - v.detach() for k, v in m.named_parameters()}  # = the gradient


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_accumulated_update_equals_one_big_batch(epsilon):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_heads=2, d_ff=64, n_layers=2, dropout=0.0, max_len=32))
    exs = _examples(9, seed=1)
    batch = lambda e: collate(e, 0, 1, 2)  # noqa: E731
    whole, whole_grad = _update(model, [batch(exs)], epsilon)
    parts, parts_grad = _update(model, [batch(exs[:2]), batch(exs[2:7]), batch(exs[7:])], epsilon)
    assert whole.n_tokens == parts.n_tokens == sum(len(t) + 1 for _, t in exs)
    assert whole.loss == pytest.approx(parts.loss, rel=1e-5)
    assert whole.nll == pytest.approx(parts.nll, rel=1e-5)
    assert not whole.skipped and not parts.skipped
    for k in whole_grad:
        torch.testing.assert_close(parts_grad[k], whole_grad[k], atol=1e-6, rtol=1e-4, msg=k)
    assert any(g.abs().sum() > 0 for g in whole_grad.values())
