"""Greedy decoding: the most probable token at every step, batched, on the KV cache."""
from __future__ import annotations

import torch
from torch import Tensor

from .common import Hypothesis, force_eos, max_output_lengths, next_token_logprobs, top_k_rows
from .static import cache_capacity, compiled_step, shrinks


@torch.inference_mode()
def greedy_search(model, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50,
                  min_length: int = 0, compile: bool = False) -> list[list[Hypothesis]]:
    """Decode a batch greedily.

    Args:
        model: a :class:`~transformer.Transformer` (put it in eval mode first).
        src: (B, S) source ids, right-padded.
        max_len_a, max_len_b: each sentence generates at most a * src_len + b tokens; EOS
            is forced at the limit.
        min_length: EOS is blocked until this many tokens (EOS included) could be reached.
        compile: every step through one compiled step on a fixed-shape cache
            (:mod:`transformer.decode.static`; finished sentences stay in the batch, their
            tokens no longer recorded, until half the rows are done: a few shapes per search).

    Returns:
        For each sentence, a list holding one :class:`Hypothesis`.
        Eagerly, finished sentences leave the batch, so their rows cost nothing afterwards.
    """
    cfg = model.cfg
    batch = src.size(0)
    limits = max_output_lengths(src, cfg, max_len_a, max_len_b)
    cache = model.start_cache(model.encode(src), src)
    if compile and hasattr(model, "step_slots"):  # (an ensemble decodes eagerly)
        return _greedy_static(model, cache, limits, min_length)
    alive = torch.arange(batch, device=src.device)  # sentence index of each row
    tokens = torch.full((batch, int(limits.max())), cfg.pad_id, dtype=torch.long, device=src.device)
    logprob = torch.zeros(batch, dtype=torch.float64, device=src.device)
    lengths = torch.zeros(batch, dtype=torch.long, device=src.device)
    last = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    step = 0
    while alive.numel() > 0:
        step += 1
        logits, cache = model.decode(last, cache)
        lp = next_token_logprobs(logits[:, -1], cfg)
        best_lp, best = _choose(lp, cfg, step, limits[alive], min_length)  # (A,)
        tokens[alive, step - 1] = best
        logprob[alive] += best_lp.double()
        lengths[alive] = step
        keep = best != cfg.eos_id
        if not bool(keep.all()):
            rows = keep.nonzero().squeeze(1)
            alive, best, cache = alive[rows], best[rows], cache.index_select(rows)
        last = best[:, None]
    return _hypotheses(tokens, lengths, logprob)


def _choose(lp: Tensor, cfg, step: int, limits: Tensor, min_length: int) -> tuple[Tensor, Tensor]:
    """(N, V) log-probabilities of step ``step`` (:func:`next_token_logprobs`; changed in
    place) -> each row's best token and its log-probability, with EOS blocked before
    ``min_length`` and forced at the row's limit."""
    if step < min_length:
        lp[:, cfg.eos_id] = float("-inf")
    force_eos(lp, limits <= step, cfg.eos_id)
    best_lp, best = top_k_rows(lp, 1)
    return best_lp[:, 0], best[:, 0]


def _hypotheses(tokens: Tensor, lengths: Tensor, logprob: Tensor) -> list[list[Hypothesis]]:
    return [[Hypothesis(tokens[i, : lengths[i]].tolist(), float(logprob[i]), float(logprob[i]))]
            for i in range(tokens.size(0))]


def _greedy_static(model, cache, limits: Tensor, min_length: int) -> list[list[Hypothesis]]:
    """Greedy search through the compiled step on a fixed-shape cache: the same tokens as the
    eager loop above. A finished sentence's row keeps decoding, unrecorded, until half the
    rows are finished; then the batch shrinks to the rows still decoding (a few batch sizes
    per search instead of a new one at every step; the graph's batch size is symbolic, so
    none is built again)."""
    cfg, batch, device = model.cfg, limits.size(0), limits.device
    longest = int(limits.max())
    static = model.start_static_cache(cache, cache_capacity(0, longest, cfg.max_len))
    step_fn = compiled_step(model, logprobs=True)  # the step returns next_token_logprobs
    tokens = torch.full((batch, longest), cfg.pad_id, dtype=torch.long, device=device)
    logprob = torch.zeros(batch, dtype=torch.float64, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)  # the sentence of each row
    live = torch.ones(batch, dtype=torch.bool, device=device)  # rows still decoding
    last = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=device)
    for step in range(1, longest + 1):
        best_lp, best = _choose(model.decode_static(last, static, step_fn), cfg, step, limits[rows], min_length)
        tokens[rows, step - 1] = torch.where(live, best, cfg.pad_id)
        logprob[rows] += torch.where(live, best_lp.double(), 0.0)
        lengths[rows] += live.long()
        live &= best != cfg.eos_id
        n_live = int(live.sum())
        if n_live == 0:
            break
        if shrinks(n_live, live.numel()):  # shrink the batch to the rows still decoding
            keep = live.nonzero().squeeze(1)
            static, rows, live, best = static.select(keep), rows[keep], live[keep], best[keep]
        last = best[:, None]
    return _hypotheses(tokens, lengths, logprob)
