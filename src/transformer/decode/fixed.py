"""The fixed-shape cache, and the decoding step on it that compiled decoding builds
(:mod:`transformer.decode.aot`): assembled here from the model's public parts
(``decoder_input``, ``decoder``, ``project``) and the decoder's cache interface
(:mod:`transformer.model.cache`), for both model kinds.

The growing :class:`~transformer.model.cache.KVCache` is a new tensor every step (one position
longer, concatenated). A :class:`FixedKVCache` has its final size from the start: each layer's
K, V are buffers (B, H_kv, L, D) for L = ``capacity`` positions, into which a step writes its
new keys and values in place and from which attention reads the slots written so far (a view,
no copy). The only size that changes from step to step is that number of slots, a symbolic
size of the compiled graph: one graph serves every step of a search.

    fixed = start_translation(model, cache, capacity)    # cross-attention K, V from model.start_cache
    logits = decode_translation(model, tgt, fixed)       # (B, T) ids -> (B, V), the last position's
    fixed = start_generation(model, batch_size, capacity)
    logits = decode_generation(model, tokens, fixed, real)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from ..model import masks
from ..model.cache import KVCache, sentences
from ..model.lm import next_positions


@dataclass
class FixedKVCache:
    """A decoder's cache at a fixed shape, written in place: a decoder-only model's, or an
    encoder-decoder's with its cross-attention K, V.

    Attributes:
        k, v: per layer, (B, H_kv, L, D) buffers for L = ``capacity`` positions.
        key_mask: (B, L) True where a slot holds a real token (left-padded prompts leave
            padding slots; slots not written yet are False).
        next_position: (B,) the position of each row's next token.
        length: slots written so far (the same for every row).
        cross_kv: an encoder-decoder's cross-attention (K, V) per layer, each (B, H, S, D),
            and ``memory_mask`` (B, 1, 1, S) or None (no padding), as in
            :class:`~transformer.model.cache.KVCache`; None for a decoder-only model. (Its
            target rows have no padding: ``key_mask`` and ``next_position`` follow ``length``.)
        group: decoder rows per source sentence (beam search), as in ``KVCache``.
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
              dtype: torch.dtype, device: torch.device | str) -> "FixedKVCache":
        def buf() -> Tensor:
            # Not zeroed: attention reads only the slots written so far, and every row writes
            # every slot up to there; zeroing 8 MB buffers (128 rows, 128 positions) cost 8% of
            # a beam search at batch 32.
            return torch.empty(batch_size, n_kv_heads, capacity, d_head, dtype=dtype, device=device)

        return cls(k=tuple(buf() for _ in range(n_layers)), v=tuple(buf() for _ in range(n_layers)),
                   key_mask=torch.zeros(batch_size, capacity, dtype=torch.bool, device=device),
                   next_position=torch.zeros(batch_size, dtype=torch.long, device=device))

    @property
    def capacity(self) -> int:
        return self.key_mask.size(1)

    @property
    def rows(self) -> int:
        return self.key_mask.size(0)

    def next_slots(self, t: int) -> Tensor:
        """The slots of the next ``t`` positions, (t,); ValueError when they do not fit. A
        tensor of its own, not a view of a longer one: a view's offset would be one more size
        for the compiled step to guard on (and, equal by chance to another size, a reason to
        compile again)."""
        if self.length + t > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; {self.length} are used and "
                             f"{t} more do not fit")
        return torch.arange(self.length, self.length + t, device=self.key_mask.device)

    def select(self, rows: Tensor) -> "FixedKVCache":
        """A smaller cache holding ``rows`` of this one, in that order (a search dropping the
        rows of finished sentences, at a few batch sizes only). With ``group`` > 1, ``rows``
        keeps whole groups, as :meth:`KVCache.index_select` does."""
        sources = sentences(rows, self.group)
        return FixedKVCache(
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


@dataclass(frozen=True)
class _LayerSlots:
    """One layer's K, V buffers (B, H_kv, L, D), as a decoder layer sees them for one step."""

    k: Tensor
    v: Tensor
    index: Tensor
    upto: int

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new K, V (B, H_kv, T_new, D) at the slots ``index`` (T_new,); return the
        buffers' first ``upto`` slots (those written, the new ones included)."""
        self.k.index_copy_(2, self.index, k)
        self.v.index_copy_(2, self.index, v)
        return self.k[:, :, : self.upto], self.v[:, :, : self.upto]


@dataclass(frozen=True)
class SlotCache:
    """The decoder's cache interface (:mod:`transformer.model.cache`) over fixed-shape
    buffers, for one step: the new positions sit at the slots ``index`` (T_new,), and
    attention reads the first ``upto`` slots. Written in place; ``grown`` is the cache itself."""

    k: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    index: Tensor
    upto: int
    cross: tuple[tuple[Tensor, Tensor], ...] | None = None
    attend_mask: Tensor | None = None
    group: int = 1

    @property
    def cross_kv(self) -> tuple:
        return self.cross if self.cross is not None else (None,) * len(self.k)

    def layer(self, i: int) -> _LayerSlots:
        return _LayerSlots(self.k[i], self.v[i], self.index, self.upto)

    def self_mask(self, t_new: int, key_mask: Tensor | None = None, device=None) -> Tensor:  # noqa: ARG002
        """(B or 1, 1, T_new, upto): causal (the slots not written yet hidden too), and the
        padding slots of ``key_mask`` (B, upto) hidden."""
        causal = masks.causal_mask_at(self.index, self.upto)
        return causal if key_mask is None else masks.combine(masks.real_keys(key_mask), causal)

    def grown(self, self_kv) -> "SlotCache":  # noqa: ARG002 (written in place already)
        return self


# ---- translation ----------------------------------------------------------------------------
def start_translation(model: nn.Module, cache: KVCache, capacity: int) -> FixedKVCache:
    """A fixed-shape cache for ``capacity`` target positions, holding the cross-attention
    K, V and source mask of ``cache`` (from ``model.start_cache``, and ``expand``-ed for
    beams: ``cache.group`` decoder rows per sentence)."""
    if not 1 <= capacity <= model.cfg.max_len:
        raise ValueError(f"capacity must be 1 to max_len={model.cfg.max_len}, got {capacity}")
    k0 = cache.cross_kv[0][0]
    attn = model.decoder.layers[0].self_attn
    fixed = FixedKVCache.empty(model.cfg.n_layers, k0.size(0) * cache.group, attn.n_kv_heads, capacity,
                               attn.d_head, k0.dtype, k0.device)
    # contiguous: the compiled step is specialised to its inputs' layout, and a search that
    # drops rows (FixedKVCache.select) hands it contiguous copies
    fixed.cross_kv = tuple((k.contiguous(), v.contiguous()) for k, v in cache.cross_kv)
    fixed.memory_mask, fixed.group = cache.attend_mask, cache.group
    return fixed


def translation_step(model: nn.Module, tgt: Tensor, index: Tensor, k: tuple[Tensor, ...], v: tuple[Tensor, ...],
                     cross_kv, memory_mask: Tensor | None, upto: int, group: int = 1) -> Tensor:
    """The tensor-only step that compiled translation runs: target tokens (B, T) at slots
    (= positions) ``index`` (T,), their self-attention K, V written into ``k``, ``v`` in
    place; attention reads the first ``upto`` slots (those written, the new ones included).
    Returns the last position's logits (B, V)."""
    x, rotary = model.decoder_input(tgt, index[None, :].expand(tgt.size(0), -1))
    h, _, _ = model.decoder(x, SlotCache(k, v, index, upto, cross_kv, memory_mask, group), rotary=rotary)
    return model.project(h[:, -1])


def decode_translation(model: nn.Module, tgt: Tensor, fixed: FixedKVCache, step=None) -> Tensor:
    """The next ``T`` target positions, written into ``fixed`` in place: (B, V) logits of the
    last one, the same numbers as ``model.decode``'s. ``step``: :func:`translation_step` on
    ``model`` or a compiled version of it (default: the former), whose output this returns
    (the searches' compiled step returns log-probabilities: :mod:`transformer.decode.static`)."""
    t = tgt.size(1)
    index = fixed.next_slots(t)
    out = (step or partial(translation_step, model))(tgt, index, fixed.k, fixed.v, fixed.cross_kv,
                                                     fixed.memory_mask, fixed.length + t, fixed.group)
    fixed.length += t
    return out


# ---- generation (decoder-only) ----------------------------------------------------------------
def start_generation(model: nn.Module, batch_size: int, capacity: int | None = None) -> FixedKVCache:
    """An empty fixed-shape cache for ``batch_size`` sequences of up to ``capacity`` tokens
    (default and most: ``max_len``), in the model's dtype and device."""
    capacity = model.cfg.max_len if capacity is None else capacity
    if not 1 <= capacity <= model.cfg.max_len:
        raise ValueError(f"capacity must be 1 to max_len={model.cfg.max_len}, got {capacity}")
    attn = model.decoder.layers[0].self_attn
    k_proj = attn.k_proj  # what the keys come out in: its weight's dtype, or an int8 layer's compute dtype
    dtype = k_proj.weight.dtype if isinstance(k_proj.weight, torch.Tensor) else k_proj.out_dtype
    return FixedKVCache.empty(model.cfg.n_layers, batch_size, attn.n_kv_heads, capacity, attn.d_head, dtype,
                              model.embed.weight.device)


def generation_step(model: nn.Module, tokens: Tensor, real: Tensor, index: Tensor, k: tuple[Tensor, ...],
                    v: tuple[Tensor, ...], key_mask: Tensor, next_position: Tensor, upto: int) -> Tensor:
    """The tensor-only step that compiled generation runs (its buffers keep their shapes from
    one step to the next): the new tokens (B, T) at slots ``index`` (T,), written into ``k``,
    ``v``, ``key_mask`` and ``next_position`` in place; attention reads the first ``upto``
    slots (those written, the new ones included). Returns the last position's logits (B, V)."""
    key_mask.index_copy_(1, index, real)
    positions = next_positions(next_position, real)
    next_position.add_(real.sum(1))
    x, rotary = model.decoder_input(tokens, positions)
    h, _, _ = model.decoder(x, SlotCache(k, v, index, upto), rotary=rotary, key_mask=key_mask[:, :upto])
    return model.project(h[:, -1])


def decode_generation(model: nn.Module, tokens: Tensor, fixed: FixedKVCache, real: Tensor | None = None,
                      step=None) -> Tensor:
    """The next ``T`` positions, written into ``fixed`` in place: (B, V) logits of the last
    one, the same numbers as ``model.decode`` at its last position.

    Args:
        tokens: (B, T) ids (left-padded prompts on the first call).
        real: (B, T) bool, True at real tokens (default: ``tokens != pad_id``).
        step: :func:`generation_step` on ``model`` or a compiled version of it (default: the former).
    """
    t = tokens.size(1)
    real = tokens != model.cfg.pad_id if real is None else real
    index = fixed.next_slots(t)
    out = (step or partial(generation_step, model))(tokens, real, index, fixed.k, fixed.v, fixed.key_mask,
                                                    fixed.next_position, fixed.length + t)
    fixed.length += t
    return out
