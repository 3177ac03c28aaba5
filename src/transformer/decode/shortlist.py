"""A vocabulary shortlist: the output projection restricted, per batch, to the target tokens
that can follow from the sources at hand (as Marian's lexical shortlists and CTranslate2's
vocabulary map do).

    shortlist = build_shortlist(pairs, source_vocab, target_vocab)   # once, from a parallel corpus
    save_shortlist(shortlist, path); shortlist = load_shortlist(path, cfg)
    hyps = search_shortlisted(model, src, shortlist, beam=4, ...)    # greedy (beam 1) or beam search

Each source token keeps the ``per_source`` target tokens that co-occur with it most
strongly in the corpus's sentence pairs (Dice's coefficient, 2 c(s, t) / (c(s) + c(t)), over
the pairs a token appears in: it ranks a word's translations above the words that are merely
frequent everywhere), itself when source and target share one vocabulary (names, numbers and
punctuation pass through unseen), and every sentence may use the ``frequent`` most frequent
target tokens and EOS. A batch's shortlist is the union over its source tokens: the
projection multiplies only those V' rows of its weight (and bias), the log-softmax is over
them (as in Marian and CTranslate2), and the search runs unchanged on V' columns, whose
chosen indices map back to vocabulary ids. With every token in the shortlist the result
is the full search's, bit for bit.

The search (greedy.py, beam.py) is not touched: it is handed the shortlisted step and the
special ids in the shortlist's numbering (:class:`LocalIds`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..errors import UserError
from .decoding_copy import shallow_copy
from .eager_step import EagerStep
from .int8 import Int8Linear
from .rows import expand_rows
from .scoring import Hypothesis, max_output_lengths, next_token_logprobs

FORMAT = "transformer-shortlist"
VERSION = "1"
PER_SOURCE = 100  # target candidates kept per source token (Marian's usual lexical shortlist keeps 100)
FREQUENT = 100  # the most frequent target tokens every sentence may use (Marian's usual 100)


@dataclass(frozen=True)
class Shortlist:
    """The candidates of every source token, as one ragged table: those of source token s are
    ``targets[offsets[s]:offsets[s + 1]]``; ``always`` every sentence may use (EOS and the
    most frequent target tokens). int64 tensors, on the CPU."""

    offsets: Tensor  # (source_vocab + 1,)
    targets: Tensor  # (offsets[-1],) target ids
    always: Tensor  # (A,) target ids
    target_vocab: int
    per_source: int = PER_SOURCE
    frequent: int = FREQUENT

    @property
    def source_vocab(self) -> int:
        return self.offsets.numel() - 1

    def for_batch(self, src: Tensor, extra: tuple[int, ...] = ()) -> Tensor:
        """(V',) the sorted target ids a batch of sources (B, S) may produce: the candidates of
        each of its tokens, ``always`` and ``extra`` (the ids the search itself needs)."""
        tokens = torch.unique(src.cpu())
        starts, ends = self.offsets[tokens], self.offsets[tokens + 1]
        counts = ends - starts
        # the ranges [start, end) of every token laid end to end, without a Python loop
        first = torch.repeat_interleave(starts - (counts.cumsum(0) - counts), counts)
        cand = self.targets[first + torch.arange(int(counts.sum()))]
        return torch.unique(torch.cat([cand, self.always, torch.tensor(extra, dtype=torch.long)]))


def build_shortlist(pairs, source_vocab: int, target_vocab: int, eos_id: int, shared: bool,
                    per_source: int = PER_SOURCE, frequent: int = FREQUENT) -> Shortlist:
    """A shortlist from ``pairs`` of (source ids, target ids) sentences: see the module's
    docstring. ``shared``: source and target number one vocabulary (each token is its own
    candidate too)."""
    src_count = np.zeros(source_vocab, dtype=np.int64)  # sentences each token is in
    tgt_count = np.zeros(target_vocab, dtype=np.int64)
    tgt_tokens = np.zeros(target_vocab, dtype=np.int64)  # occurrences, for the frequent ones
    keys = []
    for src, tgt in pairs:
        s = np.unique(np.asarray(src, dtype=np.int64))
        t_all = np.asarray(tgt, dtype=np.int64)
        t = np.unique(t_all)
        src_count[s] += 1
        tgt_count[t] += 1
        np.add.at(tgt_tokens, t_all, 1)
        keys.append((s[:, None] * target_vocab + t[None, :]).ravel())
    key, together = np.unique(np.concatenate(keys) if keys else np.zeros(0, np.int64), return_counts=True)
    s, t = key // target_vocab, key % target_vocab
    dice = 2.0 * together / (src_count[s] + tgt_count[t])
    order = np.lexsort((t, -together, -dice, s))  # by source, then strongest first (ties: commoner, lower id)
    s, t = s[order], t[order]
    rank = np.arange(s.size) - np.searchsorted(s, s)  # each pair's place among its source's
    s, t = s[rank < per_source], t[rank < per_source]
    if shared:  # each token its own candidate (first: it never pushes one out)
        own = np.arange(min(source_vocab, target_vocab))
        s, t = np.concatenate([s, own]), np.concatenate([t, own])
        s, t = s[np.lexsort((t, s))], t[np.lexsort((t, s))]
    offsets = np.zeros(source_vocab + 1, dtype=np.int64)
    np.add.at(offsets, s + 1, 1)
    top = np.argsort(-tgt_tokens, kind="stable")[:frequent]
    always = np.unique(np.append(top[tgt_tokens[top] > 0], eos_id))
    return Shortlist(torch.from_numpy(np.cumsum(offsets)), torch.from_numpy(t.copy()), torch.from_numpy(always),
                     target_vocab, per_source, frequent)


def save_shortlist(shortlist: Shortlist, path: str | Path) -> Path:
    """``path`` (a safetensors file) written atomically: the table, the sizes in its metadata.
    A symbolic link there is replaced, never written through."""
    from safetensors.torch import save

    from ..run.files import atomic_write

    data = save({"offsets": shortlist.offsets, "targets": shortlist.targets.int(), "always": shortlist.always.int()},
                metadata={"format": FORMAT, "version": VERSION, "target_vocab": str(shortlist.target_vocab),
                          "per_source": str(shortlist.per_source), "frequent": str(shortlist.frequent)})
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def load_shortlist(path: str | Path, source_vocab: int, target_vocab: int) -> Shortlist:
    """The shortlist in ``path`` for a model of these vocabularies; a one-line UserError naming
    the file when it is missing, a symbolic link, not a shortlist, corrupt, or made for other
    vocabularies. Read without following a link (no file outside the run is read)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UserError(f"{path}: no vocabulary shortlist there; decode without --shortlist, or build it "
                        "(translate --shortlist builds it from the run's training corpus)") from None
    except OSError as e:
        link = " (a symbolic link: give the file itself)" if os.path.islink(path) else ""
        raise UserError(f"{path}: cannot read the vocabulary shortlist ({e.strerror or e}){link}") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    bad = f"{path}: not a readable vocabulary shortlist"
    remedy = "; delete it and decode with --shortlist again to rebuild it"
    try:
        tensors = load(data)
        meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).get("__metadata__") or {}
    except (SafetensorError, ValueError, AttributeError) as e:
        raise UserError(f"{bad}, truncated or corrupt ({e}){remedy}") from None
    if meta.get("format") != FORMAT or set(tensors) != {"offsets", "targets", "always"}:
        raise UserError(f"{bad} (a safetensors file of another kind){remedy}")
    try:
        shortlist = Shortlist(tensors["offsets"].long(), tensors["targets"].long(), tensors["always"].long(),
                              int(meta["target_vocab"]), int(meta.get("per_source", PER_SOURCE)),
                              int(meta.get("frequent", FREQUENT)))
    except (KeyError, ValueError) as e:
        raise UserError(f"{bad} (its metadata: {e}){remedy}") from None
    if shortlist.source_vocab != source_vocab or shortlist.target_vocab != target_vocab:
        raise UserError(f"{path}: a shortlist for {shortlist.source_vocab} source and {shortlist.target_vocab} target "
                        f"tokens, but the model has {source_vocab} and {target_vocab}; it belongs to another "
                        f"model{remedy}")
    o, t, a = shortlist.offsets, shortlist.targets, shortlist.always
    if (o.dim() != 1 or t.dim() != 1 or a.dim() != 1 or int(o[0]) != 0 or int(o[-1]) != t.numel()
            or bool((o[1:] < o[:-1]).any()) or bool(((t < 0) | (t >= target_vocab)).any())
            or bool(((a < 0) | (a >= target_vocab)).any())):
        raise UserError(f"{bad} (its table is inconsistent: ids outside the vocabulary or ranges out of order)"
                        f"{remedy}")
    return shortlist


@dataclass(frozen=True)
class LocalIds:
    """What a search reads of the model's config, in a shortlist's numbering (column i of the
    shortlisted scores is vocabulary id ``ids[i]``)."""

    pad_id: int
    bos_id: int
    eos_id: int
    target_vocab_size: int

    @classmethod
    def of(cls, cfg, ids: Tensor) -> "LocalIds":
        at = {int(v): i for i, v in enumerate(ids.tolist())}
        return cls(at[cfg.pad_id], at[cfg.bos_id], at[cfg.eos_id], ids.numel())


def sliced_projection(model: nn.Module, ids: Tensor):
    """The model's output projection onto the vocabulary rows ``ids`` only: h (..., C) ->
    (..., V') logits, computed as the model's own projection computes them (the same kernel,
    the bias added the same way), so that with every row the logits are the same bits."""
    if model.out_proj is None:  # tied to the embedding, the bias in the same matmul
        weight, bias = model.output_layer()
        w, b = weight.index_select(0, ids), None if bias is None else bias.index_select(0, ids)
        return lambda h: F.linear(h, w, b)
    proj = model.out_proj
    if isinstance(proj, Int8Linear):
        rows = Int8Linear(proj.qweight.index_select(0, ids), proj.scale.index_select(0, ids),
                          None if proj.bias is None else proj.bias.index_select(0, ids), proj.kernel)
    elif type(proj) is nn.Linear:
        rows = nn.utils.skip_init(nn.Linear, proj.in_features, ids.numel(), bias=proj.bias is not None,
                                  dtype=proj.weight.dtype, device=proj.weight.device)
        rows.weight = nn.Parameter(proj.weight.index_select(0, ids), requires_grad=False)
        if proj.bias is not None:
            rows.bias = nn.Parameter(proj.bias.index_select(0, ids), requires_grad=False)
    else:
        raise ValueError(f"a vocabulary shortlist cannot slice an output projection of type {type(proj).__name__}")
    out_bias = None if model.out_bias is None else model.out_bias.index_select(0, ids)
    return rows if out_bias is None else (lambda h: rows(h) + out_bias)


class ShortlistStep(EagerStep):
    """The eager step (the model's ``decode`` on its growing cache) with the output projection
    onto the shortlist ``ids`` only: tokens in and scores out are in the shortlist's numbering."""

    def __init__(self, model: nn.Module, ids: Tensor) -> None:
        self.ids = ids.to(model.tgt_embed.weight.device)
        self.local = LocalIds.of(model.cfg, ids)
        # the model's own decode, on a copy of its modules (the weights shared) whose projection
        # is the sliced one: the caller's model is left as it is
        sliced = shallow_copy(model)
        sliced.project = sliced_projection(model, self.ids)
        super().__init__(sliced, logprobs=True)

    def __call__(self, tokens: Tensor, cache, top: int | None = None):  # noqa: ARG002 (a shortlist's rows are short)
        logits, cache = self.model.decode(self.ids[tokens], cache)
        return next_token_logprobs(logits[:, -1], self.local), cache


@torch.inference_mode()
def search_shortlisted(model: nn.Module, src: Tensor, shortlist: Shortlist, beam: int = 4, alpha: float = 0.6,
                       n_best: int = 1, max_len_a: float = 1.0, max_len_b: int = 50,
                       length_norm: str = "gnmt") -> list[list[Hypothesis]]:
    """Greedy search (``beam`` 1) or beam search of a batch ``src`` (B, S), as
    :func:`~transformer.decode.greedy.greedy_search` and :func:`~transformer.decode.beam.beam_search`
    decode it, over the batch's shortlist; the hypotheses hold vocabulary ids."""
    from .beam import decode_beams
    from .greedy import decode_greedily

    cfg = model.cfg
    ids = shortlist.for_batch(src, (cfg.pad_id, cfg.bos_id, cfg.eos_id))
    step = ShortlistStep(model, ids)
    limits = max_output_lengths(src, cfg, max_len_a, max_len_b)
    cache = model.start_cache(model.encode(src), src)
    if beam == 1:
        found = decode_greedily(step, cache, limits, step.local)
    else:
        found = decode_beams(step, expand_rows(cache, beam), limits, step.local, beam, alpha, n_best, 0, length_norm)
    vocab = ids.tolist()
    return [[Hypothesis([vocab[t] for t in h.tokens], h.score, h.logprob) for h in hyps] for hyps in found]
