"""The eager step's KV cache (:class:`BufferedKVCache`): each decoder layer's self-attention K and
V in buffers allocated once per search, for the rows and positions the search needs. It answers
what the model asks of its cache (:mod:`transformer.model.cache`) and what the searches ask of
their rows (:mod:`transformer.decode.rows`), so the model's own ``decode`` runs on it:

    cache = buffered(model, model.start_cache(memory, src), need)   # need: target positions
    logits, cache = model.decode(tokens, cache)                     # K, V into the other buffer
    cache = select_rows(cache, rows)                                # applied at the next step

Why: :class:`~transformer.model.cache.KVCache` concatenates every layer's K and V at every step
and reorders beams with ``index_select``: two new tensors of the cache's size per step. At 400
beam rows of an opus-mt-sized model one layer's K is tens of MB: over glibc's 32 MiB mmap
threshold every such tensor is a fresh mapping, page-faulted in again at every step.

Each layer's K (and V) has two flat buffers. The one in use holds the cache as a contiguous
(B, H_kv, T, D) tensor, what attention reads; a step writes the next one into the other: the
rows the search kept, in their new order, then the new positions (one copy, the reordering
and the concatenation together), and the two trade places. Not a fixed (B, H_kv, L, D) buffer
whose first T slots attention would read as a view: oneDNN's batched product (the readable
attention's, bf16 on a CPU) copies such a K, transposed, before every product, 7x the
product's time, and torch's fused kernel reads it slower too (benchmarks/decode/README.md).
Attention gets the layout the concatenation gave it, so the results are the same bits.

The buffers' shapes and dtype are the compiled step's (:func:`kv_layout`, also used by
:class:`~transformer.compiled.search_step.FixedKVCache`), so a K, V is stored as the model's key
projection gives it (bf16, an int8 layer's output dtype).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ..model.cache import KVCache
from .ensemble import EnsembleCache
from .rows import other_rows


def kv_layout(model: nn.Module) -> tuple[int, int, int, torch.dtype, torch.device]:
    """The self-attention cache of ``model``: its layers, K/V heads (H_kv), head size (D), and
    the keys' dtype (its weights', or an int8 layer's output dtype) and device."""
    attn = model.decoder.layers[0].self_attn
    dtype = attn.k_proj.weight.dtype if isinstance(attn.k_proj.weight, Tensor) else attn.k_proj.out_dtype
    return model.cfg.n_layers, attn.n_kv_heads, attn.d_head, dtype, next(model.parameters()).device


class _Buffers:
    """The storage one search's caches share: per layer, K's and V's two flat buffers of
    R * H_kv * L * D elements. The one in use holds the cache as a contiguous (rows, H_kv, T, D);
    a step writes the next one into the other (the kept rows, in their new order, and the new
    positions) and the two trade places."""

    def __init__(self, model: nn.Module, rows: int, capacity: int) -> None:
        n, heads, d_head, dtype, device = kv_layout(model)
        self.shape = (rows, heads, capacity, d_head)  # (R, H_kv, L, D)
        # One allocation (not zeroed: only written slots are read), not four per layer: blocks
        # just under glibc's 32 MiB mmap threshold left in its heap made the rest of a step's
        # allocations dearer (benchmarks/decode/README.md).
        block = torch.empty((n, 2, 2, *self.shape), dtype=dtype, device=device)  # (layer, K/V, pair, ...)
        self.k = [[block[i, 0, 0], block[i, 0, 1]] for i in range(n)]  # per layer [in use, other]
        self.v = [[block[i, 1, 0], block[i, 1, 1]] for i in range(n)]

    def advance(self, i: int, k: Tensor, v: Tensor, rows: int, length: int, order: Tensor | None):
        """Layer ``i``'s K, V after a step: the ``rows`` x ``length`` positions held (rows
        ``order`` of them, in that order; None: all, as they are) followed by the new ``k``,
        ``v`` (B, H_kv, T_new, D), as contiguous (B, H_kv, length + T_new, D) views of the
        other buffers, which are then the ones in use."""
        n, h, t, d = k.shape
        end = length + t
        if n > self.shape[0] or end > self.shape[2]:
            raise ValueError(f"the cache holds {self.shape[2]} positions of {self.shape[0]} rows; "
                             f"{n} rows of {length} + {t} positions do not fit")
        out = []
        for pair, new in ((self.k[i], k), (self.v[i], v)):
            held, other = pair
            dst = other.view(-1)[: n * h * end * d].view(n, h, end, d)
            if length:
                past = held.view(-1)[: rows * h * length * d].view(rows, h, length, d)
                if order is None:
                    dst[:, :, :length] = past
                else:
                    torch.index_select(past, 0, order, out=dst[:, :, :length])
            dst[:, :, length:] = new
            pair.reverse()
            out.append(dst)
        return tuple(out)


@dataclass(frozen=True)
class _Slots:
    """One layer's cache as the model's layer asks for it (``extend``)."""

    cache: "BufferedKVCache"
    i: int

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(B, H_kv, T_new, D) each -> (B, H_kv, T_past + T_new, D) each, contiguous."""
        c = self.cache
        return c.buffers.advance(self.i, k, v, c.held_rows, c.length, c.order)


@dataclass(frozen=True)
class BufferedKVCache:
    """:class:`~transformer.model.cache.KVCache`'s fields and answers, its self-attention K, V
    held in ``buffers`` (shared by the successive caches of one search: only the latest is
    valid): ``held_rows`` rows of ``length`` positions, of which the next step keeps rows
    ``order`` (None: all, in order), so ``rows`` of them. For decoding (inference mode: no
    gradient flows through the buffers). ``cross_kv``, ``memory_mask``, ``group``, ``padded``,
    ``key_mask``, ``next_position``: as in KVCache (plain tensors: they are small)."""

    buffers: _Buffers
    rows: int
    length: int
    cross_kv: tuple[tuple[Tensor, Tensor] | None, ...]
    memory_mask: Tensor | None
    group: int = 1
    padded: bool = True
    key_mask: Tensor | None = None
    next_position: Tensor | None = None
    held_rows: int = 0
    order: Tensor | None = None

    # The same answers as KVCache's: they read only the fields both have.
    attend_mask = KVCache.attend_mask
    self_mask = KVCache.self_mask

    @property
    def batch_size(self) -> int:
        return self.rows

    def layer(self, i: int) -> _Slots:
        return _Slots(self, i)

    def grown(self, self_kv) -> "BufferedKVCache":
        """This cache after the step (its K, V are in the buffers already)."""
        return replace(self, length=self_kv[0][0].size(2), held_rows=self.rows, order=None)

    def index_select(self, index: Tensor, same_sentences: bool = False) -> "BufferedKVCache":
        """Keep / reorder rows as :func:`~transformer.decode.rows.select_rows` does (the K, V
        at the next step, when they are copied anyway; the sentences' cross-attention K/V now,
        only when they change: not asked with ``same_sentences``, which spares the search a
        read of the device), no more rows than the buffers hold."""
        if index.numel() > self.buffers.shape[0]:
            raise ValueError(f"{index.numel()} rows asked of a cache of {self.buffers.shape[0]}")
        order = index if self.order is None else self.order.index_select(0, index)
        return replace(self, rows=index.numel(), order=order, **other_rows(self, index, same_sentences))


def buffered(model: nn.Module, cache, need: int):
    """``cache`` (``model.start_cache``'s, rows expanded) as a :class:`BufferedKVCache` with room
    for ``need`` positions; an ensemble's, member by member; another kind of cache (a
    hand-written stand-in's) as it is."""
    if isinstance(cache, EnsembleCache):
        return EnsembleCache(tuple(buffered(m, c, need) for m, c in zip(model.members, cache.caches)))
    if not isinstance(cache, KVCache):
        return cache
    capacity = min(need, model.cfg.max_len)
    if cache.length:  # (a search starts from an empty cache; one that holds positions keeps them)
        capacity = max(capacity, cache.length)
    out = BufferedKVCache(_Buffers(model, cache.batch_size, capacity), cache.batch_size, 0, cache.cross_kv,
                         cache.memory_mask, cache.group, cache.padded, cache.key_mask, cache.next_position)
    if cache.length:
        out = out.grown([out.layer(i).extend(*kv) for i, kv in enumerate(cache.self_kv)])
    return out
