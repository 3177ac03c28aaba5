"""The decoder rows a search keeps in the model's cache (:class:`~transformer.model.KVCache`):
``group`` rows per source sentence for beam search, reordered as the beams move and fewer as
sentences finish, with one ``index_select`` per tensor.

    cache = expand_rows(model.start_cache(memory, src), beam)   # row = sentence * beam + j
    cache = select_rows(cache, rows)                            # keep / reorder / repeat rows

A cache of another kind (an ensemble's, the eager step's :mod:`~transformer.decode.fixed_cache`,
a hand-written stand-in's) keeps its own rows: its ``expand`` and ``index_select`` are called
instead (:func:`other_rows` changes what is not its self-attention K, V).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from ..model.cache import KVCache


def expand_rows(cache, group: int):
    """``group`` decoder rows per sentence (row = sentence * group + j), e.g. for beams; the
    rows of a sentence share its cross-attention K/V instead of holding copies."""
    if not isinstance(cache, KVCache):
        return cache.expand(group)
    if cache.group != 1:
        raise ValueError("expand_rows works on a cache with one row per sentence")
    self_kv = tuple(None if kv is None else (kv[0].repeat_interleave(group, 0), kv[1].repeat_interleave(group, 0))
                    for kv in cache.self_kv)
    return replace(cache, self_kv=self_kv, group=group)


def select_rows(cache, index: Tensor, same_sentences: bool = False):
    """Keep / reorder / repeat decoder rows (beam reordering, pruning finished sentences).

    With ``group`` > 1, ``index`` must keep rows in groups of ``group``, each group taken from
    one sentence (as beam search does); the sentences' cross-attention K/V are gathered only
    when the set of sentences changes. ``same_sentences``: the caller knows that ``index``
    keeps every sentence, in order (beams reordered within their sentences), so that it need
    not be checked (a read from the device).
    """
    if not isinstance(cache, KVCache):  # an ensemble's caches: each checks for itself
        return cache.index_select(index)
    self_kv = tuple(_pick(kv, index) for kv in cache.self_kv)
    return replace(cache, self_kv=self_kv, **other_rows(cache, index, same_sentences))


def other_rows(cache, index: Tensor, same_sentences: bool = False) -> dict:
    """What else :func:`select_rows` changes in a cache with KVCache's fields (for any cache
    holding them, whoever keeps its self-attention K, V): the changed fields, by name."""
    if cache.memory_mask is None:  # decoder-only: every row is its own
        return dict(next_position=cache.next_position.index_select(0, index),
                    key_mask=None if cache.key_mask is None else cache.key_mask.index_select(0, index))
    sources = sentences(index, cache.group)
    n_src = cache.memory_mask.size(0)
    if same_sentences or (sources.numel() == n_src
                          and bool((sources == torch.arange(n_src, device=index.device)).all())):
        return {}  # same sentences, same order: nothing to copy
    return dict(cross_kv=tuple(_pick(kv, sources) for kv in cache.cross_kv),
                memory_mask=cache.memory_mask.index_select(0, sources))


def _pick(kv, index: Tensor):
    return None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index))


def sentences(rows: Tensor, group: int) -> Tensor:
    """The source sentence of each group of ``group`` decoder rows in ``rows`` (whole groups,
    each taken from one sentence: row = sentence * group + j)."""
    return rows.view(-1, group)[:, 0] // group if group > 1 else rows
