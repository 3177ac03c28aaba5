"""The decoder's KV cache: an explicit object passed into ``decode()`` and returned by it.

What the decoder asks of a cache (:class:`KVCache` here; any object that answers the same
can stand in for it):

    cache.layer(i).extend(k, v)  -> the K, V layer ``i``'s self-attention attends over: the
                                    cached positions' and the new ones (which the cache keeps)
    cache.self_mask(t_new, ...)  -> the new positions' self-attention mask
    cache.cross_kv, cache.attend_mask, cache.group  -> cross-attention's K, V and mask
    cache.grown(self_kv)         -> the cache after the step
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from . import masks


@dataclass(frozen=True)
class KVCache:
    """State carried between decoding steps, per decoder layer.

    Attributes:
        cross_kv: per layer, cross-attention (K, V), each (B_src, H, S, D), projected from
            the encoder output once, when the cache is started.
        self_kv: per layer, masked self-attention (K, V), each (B_src * group, H, T, D) for
            the T target positions decoded so far (None before the first step).
        memory_mask: (B_src, 1, 1, S) source padding mask, True = may attend.
        group: decoder rows per source sentence (the beam size in beam search). The rows
            of one sentence share its cross-attention K/V instead of holding copies.
        padded: False when no source holds padding; cross-attention then skips the mask
            (the same result, fewer operations).
        key_mask: decoder-only models: (B, T) True where a cached position holds a real
            token (a batch of prompts of different lengths is left-padded); None: all real.
        next_position: decoder-only models: (B,) the position of each row's next token
            (its real tokens so far), for the positional encoding.

    A decoder-only model's cache has no cross-attention: ``cross_kv`` holds None per layer
    and ``memory_mask`` is None.
    """

    cross_kv: tuple[tuple[Tensor, Tensor] | None, ...]
    self_kv: tuple[tuple[Tensor, Tensor] | None, ...]
    memory_mask: Tensor | None
    group: int = 1
    padded: bool = True
    key_mask: Tensor | None = None
    next_position: Tensor | None = None

    @property
    def attend_mask(self) -> Tensor | None:
        """The mask cross-attention needs: ``memory_mask``, or None when nothing is padding."""
        return self.memory_mask if self.padded else None

    @property
    def length(self) -> int:
        """Target positions already decoded: the position offset of the next token."""
        first = self.self_kv[0]
        return 0 if first is None else first[0].size(2)

    @property
    def batch_size(self) -> int:
        """Decoder rows."""
        if self.memory_mask is None:
            return self.next_position.size(0)
        return self.memory_mask.size(0) * self.group

    def layer(self, i: int) -> "Appended":
        """Layer ``i``'s self-attention K, V, to be extended by the new positions'."""
        return Appended(self.self_kv[i])

    def self_mask(self, t_new: int, key_mask: Tensor | None = None,
                  device: torch.device | None = None) -> Tensor | masks.Causal | None:
        """The self-attention mask of ``t_new`` new positions after the cached ones:
        (1, 1, T_new, T_past + T_new) causal, or None for one position (it sees everything);
        with ``key_mask`` (B, T_past + T_new), True at real tokens, padding keys hidden too.
        Nothing cached and nothing hidden but the future (training, a first step without
        padding): :data:`~transformer.model.masks.CAUSAL`, which the fused kernel takes as is."""
        if t_new > 1 and self.length == 0 and key_mask is None:
            return masks.CAUSAL
        causal = None if t_new == 1 else masks.causal_mask(t_new, self.length + t_new, device)
        return masks.combine(causal, None if key_mask is None else masks.real_keys(key_mask))

    def grown(self, self_kv: tuple[tuple[Tensor, Tensor], ...]) -> "KVCache":
        """This cache with every layer's self-attention K, V now ``self_kv`` (new positions included)."""
        return replace(self, self_kv=tuple(self_kv))


@dataclass(frozen=True)
class Appended:
    """One layer's cached self-attention K, V (B, H_kv, T_past, D), or None before the first
    step; a step's new positions are concatenated to them (a new tensor every step)."""

    past: tuple[Tensor, Tensor] | None

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The new K, V (B, H_kv, T_new, D) after the cached ones: (B, H_kv, T_past + T_new, D) each."""
        if self.past is None:
            return k, v
        return torch.cat([self.past[0], k], dim=2), torch.cat([self.past[1], v], dim=2)
