"""The one place where attention masks are built.

Convention for the whole codebase: a mask is a boolean tensor, **True = may attend**,
broadcastable to the attention scores of shape (B, H, T_q, T_k). (This is the meaning of
a boolean ``attn_mask`` in ``torch.nn.functional.scaled_dot_product_attention``; it is the
*opposite* of ``key_padding_mask`` in ``torch.nn.MultiheadAttention``: convert with
``~mask`` at that boundary, and nowhere else.)
"""
from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, 1, 1, S): True where the key is a real token."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | None = None) -> Tensor:
    """(1, 1, T_q, T_k): query i may attend to keys 0 .. i + (T_k - T_q).

    With a KV cache holding ``T_k - T_q`` earlier positions, the new queries sit at the end.
    """
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q
    q = torch.arange(t_q, device=device)[:, None]
    k = torch.arange(t_k, device=device)[None, :]
    return (k <= q + offset)[None, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks that are not None (None = attend everywhere)."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


def to_key_padding_mask(mask: Tensor) -> Tensor:
    """(B, 1, 1, S) True = may attend  ->  (B, S) True = padding (torch.nn.MultiheadAttention's meaning)."""
    return ~mask[:, 0, 0, :]
