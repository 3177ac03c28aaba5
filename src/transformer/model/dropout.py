"""Dropout with cheaper random numbers.

``torch.nn.Dropout`` draws one Bernoulli sample per element, and on the CPU that sampling
was the largest non-matmul cost of a training step (about 15% of a bf16 step of the
Multi30k model). Here one 64-bit draw gives four 15-bit uniform numbers; an element is
dropped when its number is below round(p * 2^15). The drop probability is therefore p
rounded to a multiple of 2^-15 (0.1 becomes 0.100006). Same generator as torch, so
``torch.manual_seed`` and the saved RNG state make it reproducible.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

_LEVELS = 1 << 15


def dropout(x: Tensor, p: float) -> Tensor:
    """``x`` with each element zeroed with probability ~p and the others scaled by 1 / (1 - p)."""
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_()
    words = bits.view(torch.int16)[:n].view(x.shape) & (_LEVELS - 1)  # uniform in [0, 2^15)
    keep = words >= round(p * _LEVELS)
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - p)))


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` (inverted dropout: scaled at training time)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return dropout(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
