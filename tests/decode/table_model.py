"""A hand-written stand-in for the Transformer: next-token probabilities come from a table
keyed by the prefix generated so far, so the right answer of a search can be computed by hand.

It drives greedy and beam search through the same interface as the real model:
``cfg``, ``encode``, ``start_cache`` and ``decode`` returning ``(logits, cache)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from transformer import ModelConfig

PAD, BOS, EOS = 0, 1, 2
Probs = dict[int, float]


@dataclass(frozen=True)
class PrefixCache:
    """Each row's source and its target prefix (BOS first); reordered like the real KVCache."""

    src: Tensor  # (B, S)
    prefix: Tensor  # (B, T)

    @property
    def length(self) -> int:
        return self.prefix.size(1)

    def index_select(self, index: Tensor) -> "PrefixCache":
        return PrefixCache(self.src.index_select(0, index), self.prefix.index_select(0, index))

    def expand(self, group: int) -> "PrefixCache":
        """``group`` consecutive rows per sentence, as KVCache.expand."""
        return self.index_select(torch.arange(self.src.size(0)).repeat_interleave(group))


class TableModel:
    """``probs(src, prefix) -> {token: probability}``; tokens left out get probability 0.

    ``src`` is the sentence's source ids without padding, ``prefix`` the tokens generated so
    far (no BOS), both tuples. Probabilities are turned into logits with log(), so the
    search sees exactly these log-probabilities when they sum to 1.
    """

    def __init__(self, probs: Callable[[tuple, tuple], Probs], vocab_size: int, max_len: int = 128) -> None:
        self.cfg = ModelConfig(vocab_size=vocab_size, d_model=2, n_heads=1, d_ff=2, n_layers=1,
                               max_len=max_len, pad_id=PAD, bos_id=BOS, eos_id=EOS)
        self.probs = probs
        self.queries: list[tuple] = []  # every prefix the search asked about

    @classmethod
    def from_table(cls, table: dict[tuple, Probs], default: Probs, vocab_size: int, **kw) -> "TableModel":
        return cls(lambda src, prefix: table.get(prefix, default), vocab_size, **kw)

    def encode(self, src: Tensor) -> Tensor:
        return src

    def start_cache(self, memory: Tensor, src: Tensor) -> PrefixCache:
        return PrefixCache(src, torch.empty(src.size(0), 0, dtype=torch.long))

    def decode(self, tgt: Tensor, cache: PrefixCache) -> tuple[Tensor, PrefixCache]:
        prefix = torch.cat([cache.prefix, tgt], dim=1)  # (B, T_past + T)
        b, t_total = prefix.shape
        logits = torch.full((b, tgt.size(1), self.cfg.target_vocab_size), float("-inf"))
        for row in range(b):
            src = tuple(x for x in cache.src[row].tolist() if x != PAD)
            ids = prefix[row].tolist()
            # (rows of a beam that is already impossible, score -inf, may carry any token)
            assert ids[0] == BOS, f"prefix {ids} does not start with BOS"
            for j, pos in enumerate(range(cache.length, t_total)):
                generated = tuple(ids[1:pos + 1])
                self.queries.append(generated)
                for tok, p in self.probs(src, generated).items():
                    logits[row, j, tok] = math.log(p) if p > 0 else float("-inf")
        return logits, PrefixCache(cache.src, prefix)
