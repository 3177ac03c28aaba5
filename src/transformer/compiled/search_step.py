"""The search step (:mod:`transformer.decode.eager_step`'s protocol) that runs a compiled step on a
cache of its final size from the start, written in place, whose finished rows stay, unread, until
half are done: one graph serves every step of every search of a kind."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..decode.eager_step import is_translation, left_pad
from ..decode.fixed_cache import kv_layout
from ..decode.rows import sentences
from .graph import GenerationStep


@dataclass
class FixedKVCache:
    """``k``, ``v`` per layer (B, H_kv, L, D) for L = ``capacity`` positions (not zeroed: zeroing
    cost 8% of a beam search); ``key_mask`` (B, L), True at real tokens; ``next_position`` (B,);
    ``length`` slots written; an encoder-decoder's cross-attention as in ``KVCache`` (its mask
    held even unpadded: a graph applies it)."""

    k: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    key_mask: Tensor
    next_position: Tensor
    length: int = 0
    cross_kv: tuple[tuple[Tensor, Tensor], ...] | None = None
    memory_mask: Tensor | None = None
    group: int = 1

    @classmethod
    def empty(cls, model: nn.Module, rows: int, capacity: int) -> "FixedKVCache":
        """Buffers on ``model``'s device, in its keys' dtype (the eager step's, :func:`kv_layout`)."""
        n, heads, d_head, dtype, device = kv_layout(model)
        shape = (rows, heads, capacity, d_head)
        return cls(k=tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(n)),
                   v=tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(n)),
                   key_mask=torch.zeros(rows, capacity, dtype=torch.bool, device=device),
                   next_position=torch.zeros(rows, dtype=torch.long, device=device))

    @property
    def capacity(self) -> int:
        return self.key_mask.size(1)

    def next_slots(self, t: int) -> Tensor:
        """The slots of the next ``t`` positions, (t,): not a view of a longer tensor (its offset
        would be one more size for the compiled step to guard on)."""
        if self.length + t > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {self.length} are used and "
                             f"{t} more do not fit")
        return torch.arange(self.length, self.length + t, device=self.key_mask.device)



class CompiledStep:
    """``model``'s compiled step (``runner()``: the loaded package, or the same step eagerly)
    driving a search, one token a row; a prompt is fed eagerly. ``logprobs``: the step gives
    log-probabilities (greedy and beam search), else logits."""

    def __init__(self, model: nn.Module, runner, logprobs: bool) -> None:
        self.model, self.runner, self.logprobs = model, runner, logprobs
        self.translation = is_translation(model)
        # the cache slots 0 .. max_len - 1 on the model's device: a step passes the first U
        self.slots = torch.arange(model.cfg.max_len, device=next(model.parameters()).device)

    def prepare(self) -> None:
        """Load (or build, if it is missing) the package now rather than at the first step."""
        self.runner()

    def _capacity(self, need: int) -> int:  # rounded up to a multiple of 64: fewer buffer sizes
        return min(self.model.cfg.max_len, -(-need // 64) * 64)

    def start(self, cache, need: int) -> FixedKVCache:
        """The fixed-shape cache for ``need`` target positions after ``model.start_cache``'s ``cache``."""
        fixed = FixedKVCache.empty(self.model, cache.batch_size, self._capacity(need))
        # contiguous: the compiled step is specialised to its inputs' layout
        fixed.cross_kv = tuple((k.contiguous(), v.contiguous()) for k, v in cache.cross_kv)
        fixed.memory_mask, fixed.group = cache.memory_mask, cache.group
        return fixed

    def prefill(self, prompts: list[list[int]], need: int):
        """The cache after ``prompts`` (fed eagerly, left-padded), and their last logits (B, V)."""
        cache = FixedKVCache.empty(self.model, len(prompts), self._capacity(need))
        ids, real = left_pad(prompts, self.model.cfg.pad_id, cache.key_mask.device)
        return cache, self._advance(GenerationStep(self.model), cache, ids, real)

    def __call__(self, tokens: Tensor, cache: FixedKVCache, top: int | None = None):  # noqa: ARG002
        """(N, 1) ids -> (N, V) scores of the next token, the cache written in place (all of
        them, whatever ``top`` asks: the graph returns the whole row)."""
        if self.translation:
            index = cache.next_slots(1)
            cache.length += 1
            return self.runner()(tokens, index, self.slots[: cache.length], cache.k, cache.v,
                            tuple(c[0] for c in cache.cross_kv), tuple(c[1] for c in cache.cross_kv),
                            cache.memory_mask), cache
        return self._advance(self.runner(), cache, tokens, torch.ones_like(tokens, dtype=torch.bool)), cache

    def _advance(self, run, cache: FixedKVCache, tokens: Tensor, real: Tensor) -> Tensor:
        index = cache.next_slots(tokens.size(1))
        cache.length += tokens.size(1)
        return run(tokens, real, index, self.slots[: cache.length], cache.k, cache.v, cache.key_mask,
                   cache.next_position)

    def keep(self, cache: FixedKVCache, rows: Tensor) -> FixedKVCache:
        """As many rows as before: reordered in place (beams: row i takes the slots row rows[i]
        wrote so far); fewer: a smaller cache, of whole groups as ``decode.rows.select_rows``."""
        if rows.numel() == cache.key_mask.size(0):
            written = [b[:, :, : cache.length] for b in (*cache.k, *cache.v)]
            for buf in (*written, cache.key_mask, cache.next_position):
                buf.copy_(buf.index_select(0, rows))
            return cache
        src = sentences(rows, cache.group)
        return FixedKVCache(
            tuple(b.index_select(0, rows) for b in cache.k), tuple(b.index_select(0, rows) for b in cache.v),
            cache.key_mask.index_select(0, rows), cache.next_position.index_select(0, rows), cache.length,
            None if cache.cross_kv is None else tuple((k.index_select(0, src), v.index_select(0, src))
                                                      for k, v in cache.cross_kv),
            None if cache.memory_mask is None else cache.memory_mask.index_select(0, src), cache.group)

    def drops(self, live: int, rows: int) -> bool:
        """When half or fewer of the ``rows`` (or, with beams, sentences) are still decoding."""
        return 1 <= live <= rows // 2

    def full(self, cache: FixedKVCache) -> bool:
        """No slot left (rows whose positions are full slide their windows)."""
        return cache.length == cache.capacity
