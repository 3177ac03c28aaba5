"""The mask helpers: boolean, True = may attend, shapes broadcastable to (B, H, T_q, T_k)."""
from __future__ import annotations

import torch

from transformer.model import masks


def test_padding_mask_marks_real_tokens():
    src = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    m = masks.padding_mask(src, pad_id=0)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True, False, False, False]]
    assert masks.padding_mask(src, pad_id=7)[1, 0, 0].tolist() == [False, True, True, True]


def test_causal_mask_is_lower_triangular():
    m = masks.causal_mask(4)
    assert m.shape == (1, 1, 4, 4) and m.dtype == torch.bool
    assert torch.equal(m[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_causal_mask_with_cached_positions():
    """Two new queries after three cached positions: they are positions 3 and 4."""
    m = masks.causal_mask(2, 5)[0, 0]
    assert m.tolist() == [[True, True, True, True, False],
                          [True, True, True, True, True]]
    # one new query sees everything cached, itself included
    assert masks.causal_mask(1, 6).all()


def test_combine_is_logical_and_ignoring_none():
    a = masks.padding_mask(torch.tensor([[5, 5, 0]]), 0)
    c = masks.causal_mask(3)
    assert masks.combine() is None and masks.combine(None, None) is None
    assert masks.combine(None, a) is a
    both = masks.combine(a, None, c)
    assert both.shape == (1, 1, 3, 3)
    assert both[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]


def test_to_key_padding_mask_has_torchs_opposite_meaning():
    m = masks.padding_mask(torch.tensor([[5, 6, 0], [7, 0, 0]]), 0)
    kpm = masks.to_key_padding_mask(m)
    assert kpm.shape == (2, 3)
    assert kpm.tolist() == [[False, False, True], [False, True, True]]  # True = padding
