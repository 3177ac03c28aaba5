"""The decoder's KV cache: an explicit object passed into ``decode()`` and returned by it."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class KVCache:
    """State carried between decoding steps, per decoder layer.

    Attributes:
        cross_kv: per layer, cross-attention (K, V), each (B, H, S, D), projected from the
            encoder output once, when the cache is started.
        self_kv: per layer, masked self-attention (K, V), each (B, H, T, D) for the T target
            positions decoded so far (None before the first step).
        memory_mask: (B, 1, 1, S) source padding mask, True = may attend.
    """

    cross_kv: tuple[tuple[Tensor, Tensor], ...]
    self_kv: tuple[tuple[Tensor, Tensor] | None, ...]
    memory_mask: Tensor

    @property
    def length(self) -> int:
        """Target positions already decoded: the position offset of the next token."""
        first = self.self_kv[0]
        return 0 if first is None else first[0].size(2)

    @property
    def batch_size(self) -> int:
        return self.memory_mask.size(0)

    def index_select(self, index: Tensor) -> "KVCache":
        """Keep / reorder / repeat batch rows (beam reordering, pruning finished sentences)."""

        def pick(kv):
            return None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index))

        return KVCache(
            cross_kv=tuple(pick(kv) for kv in self.cross_kv),
            self_kv=tuple(pick(kv) for kv in self.self_kv),
            memory_mask=self.memory_mask.index_select(0, index),
        )
