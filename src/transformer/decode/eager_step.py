"""A search's step: what greedy search, beam search and sampling call once per new token, on
the cache the step keeps. Each search is written once, over a step it is handed (by default
:class:`EagerStep`, the model's own ``decode`` on its growing KV cache):

    cache = step.start(model.start_cache(memory, src), need)   # translation: need target positions
    cache, logits = step.prefill(prompts, need)               # generation: the prompts (+ new tokens)
    scores, cache = step(tokens, cache)      # (N, 1) ids -> (N, V) scores of the next token
    top, cache = step(tokens, cache, top=n)  # or, a step that can: each row's n best (RowTop)
    cache = step.keep(cache, rows)           # keep / reorder rows (beams, finished rows)
    step.drops(live, rows)                   # whether a search drops its finished rows now
    step.full(cache)                         # generation: no room for the next token

The scores are log-probabilities (:func:`~transformer.decode.scoring.next_token_logprobs`,
``logprobs=True``, what greedy and beam search read) or the logits (sampling). Greedy and beam
search read only each row's best few, and say how many (``top``): the eager step then returns
a :class:`~transformer.decode.scoring.RowTop`, the vocabulary projected a chunk of rows at a
time, with no (N, V) tensor made; a step that cannot returns the (N, V) scores. A search never
asks how its step was made: the front door hands it the eager step or a compiled one
(:mod:`transformer.compiled`, which keeps a fixed-shape cache and drops finished rows a few
times per search rather than at once).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..model import KVCache
from .decoding_copy import shallow_copy
from .fixed_cache import BufferedKVCache, buffered
from .rows import select_rows
from .scoring import next_token_logprobs, row_top


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


def _unprojected(h: Tensor) -> Tensor:
    return h


class EagerStep:
    """``model.decode``, eagerly, on a cache whose K, V buffers are allocated once per search
    (:mod:`transformer.decode.fixed_cache`); finished rows leave at once."""

    def __init__(self, model: nn.Module, logprobs: bool = True) -> None:
        self.model, self.logprobs = model, logprobs
        self._hidden = None  # the model's decode without its projection (made when first asked)

    def start(self, cache, need: int):
        return buffered(self.model, cache, need)

    def prefill(self, prompts: list[list[int]], need: int):
        model = self.model
        ids, real = left_pad(prompts, model.cfg.pad_id, model.embed.weight.device)
        cache = buffered(model, model.start_cache(len(prompts), ids.device), need)
        logits, cache = model.decode(ids, cache, real=real)
        return cache, logits[:, -1]

    def __call__(self, tokens: Tensor, cache, top: int | None = None):
        """(N, 1) ids -> the (N, V) scores of the next token, or with ``top`` (log-probabilities
        only, a model with one projection: not an ensemble) each row's ``top`` best."""
        ranked = top is not None and self.logprobs and hasattr(self.model, "output_layer")
        model = self._without_projection() if ranked else self.model
        if is_translation(model):
            out, cache = model.decode(tokens, cache)
        else:  # a generated token is real, whatever its id
            out, cache = model.decode(tokens, cache, real=torch.ones_like(tokens, dtype=torch.bool))
        out = out[:, -1]
        if ranked:
            return row_top(out, self.model.project, self.model.cfg, top), cache
        return (next_token_logprobs(out, self.model.cfg) if self.logprobs else out), cache

    def _without_projection(self) -> nn.Module:
        """A copy of the model's modules (its weights shared) whose ``decode`` returns the last
        hidden states, not logits: :func:`~transformer.decode.scoring.row_top` projects them."""
        if self._hidden is None:
            self._hidden = shallow_copy(self.model)
            self._hidden.project = _unprojected
        return self._hidden

    def keep(self, cache, rows: Tensor):
        """As many rows as the cache holds: a search's beams, reordered within their sentences
        (every sentence stays, in order, as the compiled step assumes too); fewer: whole groups."""
        if isinstance(cache, BufferedKVCache):  # (its own rows, told what select_rows is told)
            return cache.index_select(rows, same_sentences=rows.numel() == cache.batch_size)
        same = isinstance(cache, KVCache) and rows.numel() == cache.batch_size
        return select_rows(cache, rows, same_sentences=same)

    def drops(self, live: int, rows: int) -> bool:
        """Finished rows leave as soon as there are any: they would cost a step each."""
        return live < rows

    def full(self, cache) -> bool:
        """A row's positions are full (it slides its window)."""
        return int(cache.next_position.max()) >= self.model.cfg.max_len
