"""Several models decoded as one: their next-token probabilities averaged at every step.

:class:`Ensemble` offers the interface greedy and beam search drive (``cfg``, ``encode``,
``start_cache``, ``decode``), so both decode an ensemble unchanged. Each step returns
log(mean_i p_i(y | ...)), the log of the members' averaged probabilities, as fairseq and
OpenNMT-py ensemble; the search's log-softmax of it is the identity, so hypothesis scores
are the ensemble's log-probabilities. Every member keeps its own KV cache; the ensemble's
cache is the tuple of them, reordered together.

The members must share one target vocabulary and the special ids (in practice: the same
subword model, e.g. checkpoints of one run). Sentence length limits follow the member with
the shortest positional table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ..model.cache import KVCache
from .rows import expand_rows, select_rows


@dataclass(frozen=True)
class EnsembleCache:
    """One :class:`~transformer.model.cache.KVCache` per member, kept in step."""

    caches: tuple[KVCache, ...]

    @property
    def length(self) -> int:
        return self.caches[0].length

    @property
    def batch_size(self) -> int:
        return self.caches[0].batch_size

    def expand(self, group: int) -> "EnsembleCache":
        return EnsembleCache(tuple(expand_rows(c, group) for c in self.caches))

    def index_select(self, index: Tensor) -> "EnsembleCache":
        return EnsembleCache(tuple(select_rows(c, index) for c in self.caches))


class Ensemble(nn.Module):
    """Decode ``models`` together (at least one; all in eval mode for decoding)."""

    def __init__(self, models) -> None:
        super().__init__()
        models = list(models)
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0].cfg
        for i, m in enumerate(models[1:], 1):
            for name in ("target_vocab_size", "pad_id", "bos_id", "eos_id"):
                if getattr(m.cfg, name) != getattr(first, name):
                    raise ValueError(f"ensemble member {i} has {name} {getattr(m.cfg, name)}, member 0 has "
                                     f"{getattr(first, name)}: the models must share one vocabulary")
        # Modules are registered (device moves, eval mode, precision copies); a stand-in with
        # the same interface that is not a module (the tests' table models) is kept as it is.
        modules = all(isinstance(m, nn.Module) for m in models)
        self.members = nn.ModuleList(models) if modules else tuple(models)
        self.cfg = replace(first, max_len=min(m.cfg.max_len for m in models))

    def encode(self, src: Tensor) -> tuple[Tensor, ...]:
        """(B, S) ids -> one memory (B, S, C_i) per member."""
        return tuple(m.encode(src) for m in self.members)

    def start_cache(self, memories: tuple[Tensor, ...], src: Tensor) -> EnsembleCache:
        return EnsembleCache(tuple(m.start_cache(mem, src) for m, mem in zip(self.members, memories)))

    def decode(self, tgt: Tensor, cache: EnsembleCache) -> tuple[Tensor, EnsembleCache]:
        """(B, T) ids -> (B, T, V) log of the members' mean probabilities (float32), and the
        grown caches."""
        logps, caches = [], []
        for m, c in zip(self.members, cache.caches):
            logits, c = m.decode(tgt, c)
            logps.append(torch.log_softmax(logits, dim=-1, dtype=torch.float32))
            caches.append(c)
        mean = torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))
        return mean, EnsembleCache(tuple(caches))
