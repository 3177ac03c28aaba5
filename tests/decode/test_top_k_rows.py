"""top_k_rows, the searches' top-k: topk's values and columns, by way of block maxima."""
from __future__ import annotations

import pytest
import torch

from transformer.decode.scoring import top_k_rows


@pytest.mark.parametrize("rows", [1, 4, 37])
@pytest.mark.parametrize("vocab", [65, 1000, 8000, 8003, 10007])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_the_values_and_columns_of_topk(rows, vocab, k):
    g = torch.Generator().manual_seed(vocab * 100 + k)
    x = torch.randn(rows, vocab, generator=g).log_softmax(-1)
    if rows > 2:
        x[1] = float("-inf")  # a row forced to EOS: one finite value
        x[1, 5] = -0.5
        x[2, -3:] = 10.0 + torch.arange(3.0)  # the largest in the last, partial block
    values, cols = top_k_rows(x, k)
    want = x.topk(k, dim=1)
    assert values.shape == cols.shape == (rows, k)
    assert torch.equal(values, want.values)  # descending, as topk's
    finite = torch.isfinite(want.values)  # (ties of -inf: any of those columns will do)
    assert torch.equal(cols[finite], want.indices[finite])
    assert torch.equal(x.gather(1, cols), values)


def test_the_k_largest_may_share_one_block():
    x = torch.full((6, 4096), -5.0)
    x[:, 100:108] = torch.arange(8.0)  # all eight in block 3
    values, cols = top_k_rows(x, 8)
    assert cols.tolist() == [list(range(107, 99, -1))] * 6
    assert values.tolist() == [list(map(float, range(7, -1, -1)))] * 6
