"""The fixed-shape cache, and the decoding step on it that compiled decoding builds
(:mod:`transformer.decode.aot`), for both model kinds: the model's own embeddings, layers and
projection, run by a decoder loop of its own (:func:`decoder_step`) whose attention is the
form a graph takes (:func:`graph_attention`).

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

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model import masks
from ..model.cache import KVCache
from ..model.lm import next_positions
from ..model.rotary import apply_rotary
from .rows import sentences


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
            and ``memory_mask`` (B, 1, 1, S), as in :class:`~transformer.model.cache.KVCache`
            (applied whether or not it hides anything); None for a decoder-only model. (Its
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
class Slots:
    """What one step reads and writes besides the decoder's input: each layer's K, V buffers
    (B, H_kv, L, D), into which the new positions go at ``index`` (T_new,), attention reading
    the first ``upto`` slots; an encoder-decoder's cross-attention (K, V) per layer, its source
    mask and ``group`` (decoder rows per source sentence, as in the model's cache)."""

    k: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    index: Tensor
    upto: int
    cross_kv: tuple[tuple[Tensor, Tensor], ...] | None = None
    memory_mask: Tensor | None = None
    group: int = 1


def graph_dropout(x: Tensor, p: float) -> Tensor:
    """``x`` with each element zeroed with probability p (a ``torch.rand`` draw) and the others
    scaled by 1 / (1 - p): the model's dropout as a graph draws it."""
    return x * ((torch.rand(x.shape, device=x.device) >= p).to(x.dtype) * (1.0 / (1.0 - p)))


def graph_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """:func:`transformer.model.attention`'s output as a graph computes it: on a CPU always the
    matmul-softmax-matmul, whose mask, softmax and sums inductor fuses into its own loops (not
    torch's fused kernel), with every mask applied (a graph cannot ask whether one hides
    anything) and dropout drawn with ``torch.rand`` (dynamo cannot trace the eager form's
    in-place ``random_``); elsewhere torch's fused kernel. (B, H, T_q, D)."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a query without keys: zeros
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return (graph_dropout(weights, dropout_p) if dropout_p > 0 else weights) @ v


def _self_attention(attn, h: Tensor, k_buf: Tensor, v_buf: Tensor, slots: Slots, mask: Tensor, rotary):
    """Masked self-attention of the new positions, their K, V written into the buffers."""
    q, k, v = attn.project_qkv(h)  # (B, H, T_new, D); K, V (B, H_kv, T_new, D)
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    k_buf.index_copy_(2, slots.index, k)
    v_buf.index_copy_(2, slots.index, v)
    k, v = attn.expand_kv(k_buf[:, :, : slots.upto], v_buf[:, :, : slots.upto])  # (B, H, upto, D)
    return attn.out_proj(attn.merge_heads(graph_attention(q, k, v, mask))), None


def _cross_attention(attn, h: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor, group: int):
    """Cross-attention; the ``group`` rows of a sentence attend as one row of group * T_new queries."""
    n, t, c = h.shape
    q = attn.split_heads(attn.q_proj(h if group == 1 else h.reshape(n // group, group * t, c)))
    out = attn.out_proj(attn.merge_heads(graph_attention(q, *attn.expand_kv(*kv), mask)))
    return (out if group == 1 else out.reshape(n, t, c)), None


def decoder_step(model: nn.Module, x: Tensor, slots: Slots, self_mask: Tensor, rotary=None) -> Tensor:
    """The decoder's layers on the new positions' input ``x`` (B, T_new, C), each layer's
    parameters and sub-layer connections the model's own: the same function as
    ``model.decoder``, on the fixed-shape buffers, with :func:`graph_attention`. (B, T_new, C)."""
    for i, layer in enumerate(model.decoder.layers):
        x, _ = layer.self_block(x, lambda h: _self_attention(layer.self_attn, h, slots.k[i], slots.v[i], slots,
                                                             self_mask, rotary))
        if layer.cross_attn is not None:
            x, _ = layer.cross_block(x, lambda h: _cross_attention(layer.cross_attn, h, slots.cross_kv[i],
                                                                   slots.memory_mask, slots.group))
        x, _ = layer.ffn_block(x, lambda h: (layer.ffn(h), None))
    return x if model.decoder.norm is None else model.decoder.norm(x)


def causal_slots(index: Tensor, upto: int) -> Tensor:
    """(1, 1, T_new, upto): the query at slot ``index[i]`` may attend to slots 0 .. ``index[i]``."""
    keys = torch.arange(upto, device=index.device)
    return (keys[None, :] <= index[:, None])[None, None]


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
    fixed.memory_mask, fixed.group = cache.memory_mask, cache.group  # (applied padded or not: a graph cannot ask)
    return fixed


def translation_step(model: nn.Module, tgt: Tensor, index: Tensor, k: tuple[Tensor, ...], v: tuple[Tensor, ...],
                     cross_kv, memory_mask: Tensor | None, upto: int, group: int = 1) -> Tensor:
    """The tensor-only step that compiled translation runs: target tokens (B, T) at slots
    (= positions) ``index`` (T,), their self-attention K, V written into ``k``, ``v`` in
    place; attention reads the first ``upto`` slots (those written, the new ones included).
    Returns the last position's logits (B, V)."""
    positions = index[None, :].expand(tgt.size(0), -1)
    x = model.dropout(model.positions.at(model.tgt_embed(tgt), positions))
    h = decoder_step(model, x, Slots(k, v, index, upto, cross_kv, memory_mask, group), causal_slots(index, upto))
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
    self_mask = masks.combine(masks.real_keys(key_mask[:, :upto]), causal_slots(index, upto))
    h = decoder_step(model, x, Slots(k, v, index, upto), self_mask, rotary)
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
