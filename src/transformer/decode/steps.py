"""A search's step: what greedy search, beam search and sampling call once per new token, on
the cache the step keeps. Each search is written once, over a step:

    cache = step.start(model.start_cache(memory, src), capacity)   # translation
    cache, logits = step.prefill(prompts, capacity)               # generation: the prompts
    scores, cache = step(tokens, cache)      # (N, 1) ids -> (N, V) scores of the next token
    cache = step.keep(cache, rows)           # keep / reorder rows (beams, finished rows)
    step.drops(live, rows)                   # whether a search drops its finished rows now
    step.full(cache)                         # generation: no room for the next token

The scores are log-probabilities (:func:`~transformer.decode.common.next_token_logprobs`,
``logprobs=True``, what greedy and beam search read) or the logits (sampling).

:class:`GrowingStep` is the model's own ``decode`` on its growing KV cache, eagerly; finished
rows leave at once. :class:`FixedShapeStep` runs a step on a fixed-shape cache
(:mod:`transformer.decode.fixed`), compiled ahead of time (:mod:`transformer.decode.static`);
finished rows stay, unread, until half the rows are done (a few shapes per search). Which one
a search runs is decided by :func:`transformer.decode.static.search_step`.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from . import fixed
from .common import next_token_logprobs
from .rows import select_rows


def is_translation(model) -> bool:
    """An encoder-decoder (or an ensemble of them), as opposed to a language model."""
    return hasattr(model, "encode")


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[Tensor, Tensor]:
    """(B, T) ids left-padded with ``pad_id``, and (B, T) True at the real tokens."""
    width = max(len(p) for p in prompts)
    out = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    real = torch.zeros((len(prompts), width), dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        if p:
            out[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            real[i, width - len(p):] = True
    return out, real


class GrowingStep:
    """``model.decode`` on the growing cache (a new, longer one every step), eagerly."""

    def __init__(self, model: nn.Module, logprobs: bool = True) -> None:
        self.model, self.logprobs = model, logprobs

    def start(self, cache, capacity: int):  # noqa: ARG002 (the cache grows as it needs)
        return cache

    def prefill(self, prompts: list[list[int]], capacity: int):  # noqa: ARG002
        model = self.model
        ids, real = left_pad(prompts, model.cfg.pad_id, model.embed.weight.device)
        logits, cache = model.decode(ids, model.start_cache(len(prompts), ids.device), real=real)
        return cache, logits[:, -1]

    def __call__(self, tokens: Tensor, cache):
        if is_translation(self.model):
            logits, cache = self.model.decode(tokens, cache)
        else:  # a generated token is real, whatever its id
            logits, cache = self.model.decode(tokens, cache, real=torch.ones_like(tokens, dtype=torch.bool))
        logits = logits[:, -1]
        return (next_token_logprobs(logits, self.model.cfg) if self.logprobs else logits), cache

    def keep(self, cache, rows: Tensor):
        return select_rows(cache, rows)

    def drops(self, live: int, rows: int) -> bool:
        """Finished rows leave as soon as there are any: they would cost a step each."""
        return live < rows

    def full(self, cache) -> bool:
        """A row's positions are full (it slides its window)."""
        return int(cache.next_position.max()) >= self.model.cfg.max_len


class FixedShapeStep:
    """One step on a fixed-shape cache (:class:`~transformer.decode.fixed.FixedKVCache`),
    written in place: ``run`` is the step compiled (:func:`transformer.decode.static.compiled_step`;
    it takes one token a row, and returns log-probabilities when ``logprobs``), or None: the
    step eagerly (:func:`~transformer.decode.fixed.translation_step`,
    :func:`~transformer.decode.fixed.generation_step`), which returns logits. A prompt is
    always fed eagerly."""

    def __init__(self, model: nn.Module, run=None, logprobs: bool = True) -> None:
        self.model, self.run, self.logprobs = model, run, logprobs

    def start(self, cache, capacity: int) -> fixed.FixedKVCache:
        return fixed.start_translation(self.model, cache, capacity)

    def prefill(self, prompts: list[list[int]], capacity: int):
        model = self.model
        cache = fixed.start_generation(model, len(prompts), capacity)
        ids, real = left_pad(prompts, model.cfg.pad_id, cache.key_mask.device)
        return cache, fixed.decode_generation(model, ids, cache, real)

    def __call__(self, tokens: Tensor, cache: fixed.FixedKVCache):
        if is_translation(self.model):
            out = fixed.decode_translation(self.model, tokens, cache, self.run)
        else:  # a generated token is real, whatever its id
            out = fixed.decode_generation(self.model, tokens, cache, torch.ones_like(tokens, dtype=torch.bool), self.run)
        if self.run is None and self.logprobs:
            out = next_token_logprobs(out, self.model.cfg)
        return out, cache

    def keep(self, cache: fixed.FixedKVCache, rows: Tensor) -> fixed.FixedKVCache:
        """As many rows as before: reordered in place (beams); fewer: a smaller cache."""
        if rows.numel() == cache.rows:
            cache.reorder(rows)
            return cache
        return cache.select(rows)

    def drops(self, live: int, rows: int) -> bool:
        """When half or fewer of the ``rows`` (or, with beams, sentences) are still decoding:
        a search runs at a few batch sizes only (the step's batch is a symbolic size: any will
        do, but each new one costs a copy of the cache)."""
        return 1 <= live <= rows // 2

    def full(self, cache: fixed.FixedKVCache) -> bool:
        """No slot left (rows whose positions are full slide their windows)."""
        return cache.length == cache.capacity
