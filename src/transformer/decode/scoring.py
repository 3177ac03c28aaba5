"""What greedy and beam search share: hypotheses and their scores (the length penalty, next-token
log-probabilities, the top k of each row, each row's best few found a chunk of rows at a time),
length limits, batches by length, a padded batch."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.config import ModelConfig


@dataclass(frozen=True)
class Hypothesis:
    """One output sentence.

    tokens: generated ids, without BOS, ending with exactly one EOS.
    logprob: sum of the token log-probabilities (natural log).
    score: logprob divided by the length penalty (the ranking score).
    """

    tokens: list[int]
    score: float
    logprob: float


def length_penalty(length: int | Tensor, alpha: float, norm: str = "gnmt") -> float | Tensor:
    """The length penalty lp(Y), |Y| counting the EOS token: GNMT's ((5 + |Y|) / 6) ** alpha
    (``norm="gnmt"``), or |Y| ** alpha (``norm="length"``: Hugging Face's ``length_penalty``,
    fairseq's ``lenpen``).

    Scores are logprob / lp. Since log-probabilities are negative, alpha > 0 favours
    longer outputs and alpha = 0 ranks by raw log-probability.
    """
    if norm == "length":
        return length ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src: Tensor, cfg: ModelConfig, a: float = 1.0, b: int = 50) -> Tensor:
    """(B,) the most tokens (EOS included) each sentence may generate: a * source length + b,
    counting the source's real tokens only (padding never changes a sentence's limit), and
    never more than the positional table allows."""
    src_len = (src != cfg.pad_id).sum(dim=1)
    # clamped before the sum, in float64 and as a Python int: a and b of any size (10**20) cannot overflow int64
    limit = (a * src_len.double()).floor().clamp(max=cfg.max_len).long() + min(b, cfg.max_len)
    return limit.clamp(min=1, max=cfg.max_len)


_BLOCK = 32  # columns per block in top_k_rows


def top_k_rows(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=1)`` of an (N, V) float tensor: the k largest values of each row, in
    descending order, and their columns; among equal values the column chosen may differ.

    A search picks a few of a whole vocabulary's log-probabilities each step. On a CPU,
    ``topk`` and ``max`` over a row compare one element at a time (3-4 ms for 128 rows of
    8,000; ``amax``, which needs no position, takes a tenth of that), so from 4 rows on this
    finds them in three small steps (half the time at 128 rows): the maximum of each block
    of 32 columns (a vectorised ``amax``); the k blocks with the largest maxima, which hold
    the row's k largest values (a value outside them is at most its own block's maximum,
    which k larger block maxima exceed); and ``topk`` over those k x 32 columns and the
    last partial block."""
    n, v = x.shape
    whole = v - v % _BLOCK
    if x.device.type != "cpu" or n < 4 or whole < 4 * k * _BLOCK:
        return x.topk(k, dim=1)
    blocks = x[:, :whole].view(n, whole // _BLOCK, _BLOCK).amax(dim=2)  # (N, V // 32)
    first = blocks.topk(k, dim=1).indices * _BLOCK  # (N, k) the first column of each chosen block
    cols = (first[:, :, None] + torch.arange(_BLOCK, device=x.device)).view(n, k * _BLOCK)
    if whole < v:
        cols = torch.cat([cols, torch.arange(whole, v, device=x.device).expand(n, -1)], dim=1)
    values, at = x.gather(1, cols).topk(k, dim=1)
    return values, cols.gather(1, at)


def next_token_logprobs(logits: Tensor, cfg: ModelConfig, overwrite: bool = False) -> Tensor:
    """(N, V) logits of the last position -> log-probabilities in float32, with PAD and BOS
    made impossible (they are never a correct next token). ``overwrite``: float32 ``logits``
    that nothing else reads may be overwritten by them."""
    if overwrite and logits.dtype == torch.float32 and logits.is_contiguous() and not logits.requires_grad:
        # in place: each row is read (its maximum, its sum) before it is written; the same
        # numbers, 3.1 ms against 5.1 at (100, 58,101) on one thread (no second tensor to fill)
        lp = torch._log_softmax(logits, -1, False, out=logits)
    else:
        # dtype= reads bf16 logits straight into the float32 result (no float copy of a (N, V)
        # tensor first): the same numbers, 9.0 ms against 15.4 at (128, 58,101) on one thread.
        lp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    lp[:, cfg.pad_id] = float("-inf")
    if cfg.bos_id != cfg.eos_id:
        lp[:, cfg.bos_id] = float("-inf")
    return lp


# Rows of log-probabilities projected and normalised at a time by :func:`row_top`: 8M float32
# values (32 MiB). A larger per-step tensor is, with glibc, a fresh mmap every step, its pages
# faulted in again: at 200 beam rows of a 58,101-token vocabulary that was a third of fp32
# decoding's time (benchmarks/decode/README.md, "the output projection in chunks").
CHUNK_VALUES = 1 << 23


@dataclass(frozen=True)
class RowTop:
    """Each row's best ``n`` next-token log-probabilities, what a search reads of a step's
    (N, V) scores: ``values`` (N, n) in descending order, their ``tokens`` (N, n), and each
    row's EOS log-probability ``eos`` (N,), which a search may need when EOS is not among
    them (forced at the length limit)."""

    values: Tensor
    tokens: Tensor
    eos: Tensor

    def index_select(self, dim: int, index: Tensor) -> "RowTop":
        """These rows (``dim`` 0), as ``Tensor.index_select`` picks rows of full scores."""
        assert dim == 0
        return RowTop(self.values.index_select(0, index), self.tokens.index_select(0, index), self.eos.index_select(0, index))


def row_top(h: Tensor, project, cfg: ModelConfig, n: int) -> RowTop:
    """The :class:`RowTop` of the ``n`` best of each row of ``project(h)``'s log-probabilities
    (:func:`next_token_logprobs`), ``h`` (N, C) the decoder's last hidden states: the rows
    are projected and normalised a chunk at a time (:data:`CHUNK_VALUES`), so that no (N, V)
    tensor is made; each row's values are those of the whole (N, V) log-probabilities."""
    vocab = cfg.target_vocab_size
    chunks = -(-h.size(0) * vocab // CHUNK_VALUES)
    values, tokens, eos = [], [], []
    for part in h.tensor_split(max(1, chunks)):
        lp = next_token_logprobs(project(part), cfg, overwrite=True)  # (the chunk's logits are its own)
        v, t = top_k_rows(lp, min(n, vocab))
        values.append(v), tokens.append(t), eos.append(lp[:, cfg.eos_id])
    return RowTop(torch.cat(values), torch.cat(tokens), torch.cat(eos))


def best_of_rows(scores: Tensor | RowTop, n: int, eos_id: int, block_eos: bool, at_limit: Tensor
                 ) -> tuple[Tensor, Tensor]:
    """Each row's ``n`` best log-probabilities and their tokens, as a search ranks them:
    EOS blocked where ``block_eos`` (before ``min_length``), and only EOS, with its real
    log-probability, for the rows ``at_limit`` (bool, N). ``scores`` is a step's (N, V)
    log-probabilities (changed in place) or its :class:`RowTop` of at least ``n + 1`` a row
    (one more than ``n``, in case EOS, blocked, is among them)."""
    if isinstance(scores, Tensor):
        if block_eos:
            scores[:, eos_id] = float("-inf")
        force_eos(scores, at_limit, eos_id)
        return top_k_rows(scores, n)
    values, tokens, eos = scores.values, scores.tokens, scores.eos
    if block_eos:
        values, eos = values.masked_fill(tokens == eos_id, float("-inf")), torch.full_like(eos, float("-inf"))
        values, at = values.topk(n, dim=1)  # (the n best of the n + 1 left)
        tokens = tokens.gather(1, at)
    else:
        values, tokens = values[:, :n].contiguous(), tokens[:, :n].contiguous()
    if at_limit.device.type != "cpu" or at_limit.any():  # (see force_eos)
        only = torch.full_like(values, float("-inf"))
        only[:, 0] = eos
        values = torch.where(at_limit[:, None], only, values)
        tokens = torch.where(at_limit[:, None] & (torch.arange(n, device=tokens.device) == 0), eos_id, tokens)
    return values, tokens


def force_eos(lp: Tensor, rows: Tensor, eos_id: int) -> None:
    """In place: rows (bool, N) may only emit EOS, keeping its real log-probability.

    On a CPU it first asks whether any row is at its limit (most steps none is: the pass over
    the scores is skipped); elsewhere it does not ask, since on a GPU that read would wait for
    the queue of kernels every step."""
    if lp.device.type == "cpu" and not rows.any():
        return
    eos_lp = lp[:, eos_id].clone()
    lp.masked_fill_(rows[:, None], float("-inf"))
    lp[:, eos_id] = eos_lp


def length_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """The inputs of these ``lengths`` (their positions in the list), shortest first (equal
    lengths in input order), in batches whose padded size (rows x the longest) fits
    ``max_tokens``; an input longer than that is a batch of its own."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches, start = [], 0
    while start < len(order):
        end = start + 1  # grow the batch while its padded size fits the budget
        while end < len(order) and (end + 1 - start) * lengths[order[end]] <= max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def pad_batch(seqs: list[list[int]], pad_id: int, device: torch.device | None = None) -> Tensor:
    """Right-pad lists of ids into a (B, L) LongTensor."""
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), max(width, 1)), pad_id, dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        if s:
            out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out
