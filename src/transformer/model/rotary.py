"""Rotary position embeddings (RoFormer, Su et al. 2021; Llama): instead of adding a position
vector to the input, rotate each query and key by an angle proportional to its position, so
that their dot product depends on the distance between the two positions only.

The "rotate half" layout of Llama and Hugging Face: dimension i of a head pairs with
dimension i + D/2, and the pair (x_i, x_{i+D/2}) turns by position * theta^(-2i/D).

Llama 3 stretches a model to a longer context by scaling those frequencies
(:func:`llama3_frequencies`): slow pairs turn ``factor`` times slower, fast pairs as before,
and the pairs in between are blended.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn



class Rotary(nn.Module):
    """The cos / sin tables for ``max_len`` positions of heads of size ``d_head``."""

    def __init__(self, d_head: int, max_len: int, theta: float = 10000.0,
                 scaling: dict[str, float] | None = None) -> None:
        super().__init__()
        self.max_len = max_len
        inv_freq = 1.0 / theta ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (D/2,)
        if scaling is not None:
            inv_freq = llama3_frequencies(inv_freq, **scaling)
        angle = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (L, D/2)
        angle = torch.cat([angle, angle], dim=-1)  # (L, D): the same angle for i and i + D/2
        self.register_buffer("cos", angle.cos().float(), persistent=False)
        self.register_buffer("sin", angle.sin().float(), persistent=False)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T) or (T,) positions, each below ``max_len`` -> cos, sin broadcastable to
        (B, H, T, D). (The model checks the positions: :meth:`LanguageModel.hidden`.)"""
        cos, sin = self.cos[positions], self.sin[positions]  # (..., T, D)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
        return cos, sin


def llama3_frequencies(inv_freq: Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                       original_max_position_embeddings: float) -> Tensor:
    """Llama 3's scaled frequencies (D/2,) for the unscaled ``inv_freq`` (D/2,), as HF's
    ``rope_type: llama3``: a pair whose wavelength is longer than ``original / low_freq_factor``
    positions turns ``factor`` times slower, one shorter than ``original / high_freq_factor``
    is unchanged, and in between the two are mixed linearly in ``original / wavelength``."""
    original = float(original_max_position_embeddings)
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)  # 0 slow .. 1 fast
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > original / low_freq_factor, inv_freq / factor, blended)
    return torch.where(wavelength < original / high_freq_factor, inv_freq, scaled)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys ``x`` (B, H, T, D) to their positions."""
    return (x * cos.to(x.dtype)) + (rotate_half(x) * sin.to(x.dtype))
