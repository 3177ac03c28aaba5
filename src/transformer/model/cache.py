"""The decoder's KV cache: an explicit object passed into ``decode()`` and returned by it."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


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

    def expand(self, group: int) -> "KVCache":
        """``group`` decoder rows per sentence (row = sentence * group + j), e.g. for beams."""
        if self.group != 1:
            raise ValueError("expand() works on a cache with one row per sentence")
        self_kv = tuple(None if kv is None else (kv[0].repeat_interleave(group, 0), kv[1].repeat_interleave(group, 0))
                        for kv in self.self_kv)
        return replace(self, self_kv=self_kv, group=group)

    def index_select(self, index: Tensor) -> "KVCache":
        """Keep / reorder / repeat decoder rows (beam reordering, pruning finished sentences).

        With ``group`` > 1, ``index`` must keep rows in groups of ``group``, each group
        taken from one sentence (as beam search does); the sentences' cross-attention K/V
        are gathered only when the set of sentences changes.
        """

        def pick(kv, idx):
            return None if kv is None else (kv[0].index_select(0, idx), kv[1].index_select(0, idx))

        self_kv = tuple(pick(kv, index) for kv in self.self_kv)
        if self.memory_mask is None:  # decoder-only: every row is its own
            return replace(self, self_kv=self_kv, next_position=self.next_position.index_select(0, index),
                           key_mask=None if self.key_mask is None else self.key_mask.index_select(0, index))
        sources = _sentences(index, self.group)
        n_src = self.memory_mask.size(0)
        if sources.numel() == n_src and bool((sources == torch.arange(n_src, device=index.device)).all()):
            return replace(self, self_kv=self_kv)  # same sentences, same order: nothing to copy
        return replace(self, cross_kv=tuple(pick(kv, sources) for kv in self.cross_kv), self_kv=self_kv,
                       memory_mask=self.memory_mask.index_select(0, sources))


def _sentences(rows: Tensor, group: int) -> Tensor:
    """The source sentence of each group of ``group`` decoder rows in ``rows`` (whole groups,
    each taken from one sentence: row = sentence * group + j)."""
    return rows.view(-1, group)[:, 0] // group if group > 1 else rows


@dataclass(frozen=True)
class Slots:
    """One layer's self-attention K, V at a fixed shape: buffers (B, H_kv, L, D) preallocated
    for L positions, into which a decoding step writes its new keys and values in place, at
    the slots ``index`` (T_new,). Attention then reads the first ``upto`` slots, those
    written so far (a view, no copy). (The growing cache of :class:`KVCache` is a new tensor
    every step, made by concatenation; these buffers stay, so one compiled step, with the
    number of slots read as a symbolic size, serves a whole search.)"""

    k: Tensor
    v: Tensor
    index: Tensor
    upto: int

    def write(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new K, V (B, H_kv, T_new, D) at ``index``; return the buffers' first
        ``upto`` slots."""
        self.k.index_copy_(2, self.index, k)
        self.v.index_copy_(2, self.index, v)
        return self.k[:, :, : self.upto], self.v[:, :, : self.upto]


@dataclass
class StaticKVCache:
    """A decoder's cache at a fixed shape, written in place (see :class:`Slots`): a
    decoder-only model's, or an encoder-decoder's with its cross-attention K, V.

    Attributes:
        k, v: per layer, (B, H_kv, L, D) buffers for L = ``capacity`` positions.
        key_mask: (B, L) True where a slot holds a real token (left-padded prompts leave
            padding slots; slots not written yet are False).
        next_position: (B,) the position of each row's next token.
        length: slots written so far (the same for every row).
        cross_kv: an encoder-decoder's cross-attention (K, V) per layer, each (B, H, S, D),
            and ``memory_mask`` (B, 1, 1, S) or None (no padding), as in :class:`KVCache`;
            None for a decoder-only model. (Its target rows have no padding: ``key_mask``
            and ``next_position`` follow ``length``.)
        group: decoder rows per source sentence (beam search), as in :class:`KVCache`.
    """

    k: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    key_mask: Tensor
    next_position: Tensor
    length: int = 0
    cross_kv: tuple[tuple[Tensor, Tensor], ...] | None = None
    memory_mask: Tensor | None = None
    group: int = 1

    @classmethod
    def empty(cls, n_layers: int, batch_size: int, n_kv_heads: int, capacity: int, d_head: int,
              dtype: torch.dtype, device: torch.device | str) -> "StaticKVCache":
        def buf() -> Tensor:
            # Not zeroed: attention reads only the slots written so far (``Slots.upto``), and
            # every row writes every slot up to there; zeroing 8 MB buffers (128 rows, 128
            # positions) cost 8% of a beam search at batch 32.
            return torch.empty(batch_size, n_kv_heads, capacity, d_head, dtype=dtype, device=device)

        return cls(k=tuple(buf() for _ in range(n_layers)), v=tuple(buf() for _ in range(n_layers)),
                   key_mask=torch.zeros(batch_size, capacity, dtype=torch.bool, device=device),
                   next_position=torch.zeros(batch_size, dtype=torch.long, device=device))

    @property
    def capacity(self) -> int:
        return self.key_mask.size(1)

    def next_slots(self, t: int) -> Tensor:
        """The slots of the next ``t`` positions, (t,); ValueError when they do not fit. A
        tensor of its own, not a view of a longer one: a view's offset would be one more size
        for the compiled step to guard on (and, equal by chance to another size, a reason to
        compile again)."""
        if self.length + t > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {self.length} are used and "
                             f"{t} more do not fit")
        return torch.arange(self.length, self.length + t, device=self.key_mask.device)

    def select(self, rows: Tensor) -> "StaticKVCache":
        """A smaller cache holding ``rows`` of this one, in that order (a search dropping the
        rows of finished sentences, at a few batch sizes only). With ``group`` > 1, ``rows``
        keeps whole groups, as :meth:`KVCache.index_select` does."""
        sources = _sentences(rows, self.group)
        return StaticKVCache(
            k=tuple(b.index_select(0, rows) for b in self.k), v=tuple(b.index_select(0, rows) for b in self.v),
            key_mask=self.key_mask.index_select(0, rows), next_position=self.next_position.index_select(0, rows),
            length=self.length, group=self.group,
            cross_kv=None if self.cross_kv is None else tuple((k.index_select(0, sources), v.index_select(0, sources))
                                                             for k, v in self.cross_kv),
            memory_mask=None if self.memory_mask is None else self.memory_mask.index_select(0, sources))

    def reorder(self, order: Tensor) -> None:
        """In place: row ``i`` takes the contents of row ``order[i]`` (beam search), every
        buffer keeping its shape; only the slots written so far move. Cross-attention K, V
        are per sentence and do not move."""
        for buf in (*self.k, *self.v):
            written = buf[:, :, : self.length]
            written.copy_(written.index_select(0, order))
        for buf in (self.key_mask, self.next_position):
            buf.copy_(buf.index_select(0, order))
