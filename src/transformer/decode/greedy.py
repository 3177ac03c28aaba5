"""Greedy decoding: the most probable token at every step, batched, on the KV cache."""
from __future__ import annotations

import torch
from torch import Tensor

from .eager_step import EagerStep
from .scoring import Hypothesis, best_of_rows, max_output_lengths


@torch.inference_mode()
def greedy_search(model, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50,
                  min_length: int = 0, step=None) -> list[list[Hypothesis]]:
    """Decode a batch greedily.

    Args:
        model: a :class:`~transformer.Transformer` (put it in eval mode first).
        src: (B, S) source ids, right-padded.
        max_len_a, max_len_b: each sentence generates at most a * src_len + b tokens; EOS
            is forced at the limit.
        min_length: EOS is blocked until this many tokens (EOS included) could be reached.
        step: the step every position is decoded by (:mod:`transformer.decode.eager_step`;
            default: the model's own ``decode``, eagerly), returning log-probabilities.

    Returns:
        For each sentence, a list holding one :class:`Hypothesis`.
    """
    cfg = model.cfg
    limits = max_output_lengths(src, cfg, max_len_a, max_len_b)
    step = EagerStep(model) if step is None else step
    return decode_greedily(step, model.start_cache(model.encode(src), src), limits, cfg, min_length)


def decode_greedily(step, cache, limits: Tensor, cfg, min_length: int = 0) -> list[list[Hypothesis]]:
    """Greedy search through ``step`` (:mod:`transformer.decode.eager_step`) from ``cache`` (the
    model's, after the encoder): each row takes its best token until EOS or its limit
    (``limits`` (B,)). A finished row stops being recorded, and leaves the batch when the
    step drops finished rows (the eager step at once; a compiled one when half the rows are
    done, so that it runs at a few batch sizes only)."""
    batch, device = limits.size(0), limits.device
    longest = int(limits.max())
    cache = step.start(cache, longest)
    tokens = torch.full((batch, longest), cfg.pad_id, dtype=torch.long, device=device)
    logprob = torch.zeros(batch, dtype=torch.float64, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)  # the sentence of each row
    live = torch.ones(batch, dtype=torch.bool, device=device)  # rows still decoding
    last = torch.full((batch, 1), cfg.bos_id, dtype=torch.long, device=device)
    for t in range(1, longest + 1):
        lp, cache = step(last, cache, top=2)  # (the best, and the next in case the best is a blocked EOS)
        best_lp, best = best_of_rows(lp, 1, cfg.eos_id, t < min_length, limits[rows] <= t)
        best_lp, best = best_lp[:, 0], best[:, 0]
        tokens[rows, t - 1] = torch.where(live, best, cfg.pad_id)
        logprob[rows] += torch.where(live, best_lp.double(), 0.0)
        lengths[rows] += live.long()
        live &= best != cfg.eos_id
        n_live = int(live.sum())
        if n_live == 0:
            break
        if step.drops(n_live, live.numel()):
            keep = live.nonzero().squeeze(1)
            cache, rows, live, best = step.keep(cache, keep), rows[keep], live[keep], best[keep]
        last = best[:, None]
    # read back at once: three reads, not four a sentence (on a GPU each waits for the queue)
    tokens, lengths, logprob = tokens.tolist(), lengths.tolist(), logprob.tolist()
    return [[Hypothesis(ids[:n], lp, lp)] for ids, n, lp in zip(tokens, lengths, logprob)]

