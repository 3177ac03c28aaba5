"""The one place where attention masks are built.

Convention for the whole codebase: a mask is a boolean tensor, **True = may attend**,
broadcastable to the attention scores of shape (B, H, T_q, T_k); or :data:`CAUSAL`, the
causal mask of a sequence attending to itself, which is not built until someone needs it
as a tensor (torch's fused kernel does not: it takes ``is_causal=True``). (This is the meaning of
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


class Causal:
    """The causal mask of as many queries as keys (nothing cached before them, no padding among
    the keys), not built as a tensor: query i may attend to keys 0 .. i. Torch's fused kernel
    takes it as ``is_causal=True`` (on a GPU the flash kernel, which any mask tensor rules out);
    :meth:`tensor` is the same mask as :func:`causal_mask` builds it."""

    def tensor(self, t_q: int, t_k: int, device: torch.device | None = None) -> Tensor:
        if t_q != t_k:
            raise ValueError(f"CAUSAL masks as many queries as keys, got {t_q} and {t_k}")
        return causal_mask(t_q, t_k, device)

    def __repr__(self) -> str:
        return "CAUSAL"


#: The one :class:`Causal`: ``mask is CAUSAL`` says that only the future is masked.
CAUSAL = Causal()


def causal_slots(index: Tensor, upto: int) -> Tensor:
    """(1, 1, T_new, U): the causal mask of new positions written at cache slots ``index``
    (T_new,) among the first ``upto`` slots: the query at slot ``index[i]`` may attend to slots
    0 .. ``index[i]``."""
    return (torch.arange(upto, device=index.device)[None, :] <= index[:, None])[None, None]


def real_keys(real: Tensor) -> Tensor:
    """(B, T_k) True at real tokens -> (B, 1, 1, T_k): the keys that may be attended to
    (a decoder-only model's left-padded batch)."""
    return real[:, None, None, :]


def extend_real_keys(past: Tensor | None, real: Tensor, t_past: int) -> Tensor:
    """A cache's record of real keys grown by the new positions: (B, T_past) ``past`` (None:
    all ``t_past`` real) followed by ``real`` (B, T_new) -> (B, T_past + T_new)."""
    past = real.new_ones(real.size(0), t_past) if past is None else past
    return torch.cat([past, real], dim=1)


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks that are not None (None = attend everywhere); tensors only."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


def to_key_padding_mask(mask: Tensor) -> Tensor:
    """(B, 1, 1, S) True = may attend  ->  (B, S) True = padding (torch.nn.MultiheadAttention's meaning)."""
    return ~mask[:, 0, 0, :]
