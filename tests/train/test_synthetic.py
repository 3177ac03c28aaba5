"""The synthetic copy / reverse task: batches are well formed, and a toy model learns reversal."""
from __future__ import annotations

import pytest
import torch

from transformer.train.synthetic import make_batch, train_synthetic


def test_make_batch_layout():
    batch = make_batch("reverse", 8, n_symbols=5, min_len=2, max_len=4, gen=torch.Generator().manual_seed(0))
    assert batch.src.shape[0] == 8 and batch.tgt_in.shape == batch.tgt_out.shape
    for i, target in enumerate(batch.target):
        n = len(target)
        src = batch.src[i].tolist()
        assert src[:n] == target[::-1] and src[n] == 2 and all(x == 0 for x in src[n + 1:])
        assert batch.tgt_in[i, : n + 1].tolist() == [1] + target
        assert batch.tgt_out[i, : n + 1].tolist() == target + [2]
        assert all(4 <= x < 9 for x in target) and 2 <= n <= 4
    assert batch.n_tgt_tokens == sum(len(t) + 1 for t in batch.target)
    copy = make_batch("copy", 4, 5, 2, 4, torch.Generator().manual_seed(0))
    assert all(copy.src[i, : len(t)].tolist() == t for i, t in enumerate(copy.target))


def test_unknown_task_is_rejected():
    with pytest.raises(ValueError, match="task must be 'copy' or 'reverse'"):
        train_synthetic("sort")


@pytest.mark.slow
def test_toy_model_learns_to_reverse():
    """End to end: model, loss, schedule, train_step and greedy decoding together
    (~45 s on one CPU thread)."""
    lines: list[str] = []
    model, accuracy = train_synthetic("reverse", log=lines.append)
    assert accuracy >= 0.99, "\n".join(lines)
    assert not model.training
