"""Greedy decoding: the most probable token at every step, batched, on the KV cache."""
from __future__ import annotations

import torch
from torch import Tensor

from .common import Hypothesis, force_eos, max_output_lengths, next_token_logprobs


@torch.inference_mode()
def greedy_search(model, src: Tensor, max_len_a: float = 1.0, max_len_b: int = 50,
                  min_length: int = 0) -> list[list[Hypothesis]]:
    """Decode a batch greedily.

    Args:
        model: a :class:`~transformer.Transformer` (put it in eval mode first).
        src: (B, S) source ids, right-padded.
        max_len_a, max_len_b: each sentence generates at most a * src_len + b tokens; EOS
            is forced at the limit.
        min_length: EOS is blocked until this many tokens (EOS included) could be reached.

    Returns:
        For each sentence, a list holding one :class:`Hypothesis`.
        Finished sentences leave the batch, so their rows cost nothing afterwards.
    """
    cfg = model.cfg
    batch = src.size(0)
    limits = max_output_lengths(src, cfg, max_len_a, max_len_b)
    cache = model.start_cache(model.encode(src), src)
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
        if step < min_length:
            lp[:, cfg.eos_id] = float("-inf")
        force_eos(lp, limits[alive] <= step, cfg.eos_id)
        best_lp, best = lp.max(dim=-1)  # (A,)
        tokens[alive, step - 1] = best
        logprob[alive] += best_lp.double()
        lengths[alive] = step
        keep = best != cfg.eos_id
        if not bool(keep.all()):
            rows = keep.nonzero().squeeze(1)
            alive, best, cache = alive[rows], best[rows], cache.index_select(rows)
        last = best[:, None]
    return [
        [Hypothesis(tokens[i, : lengths[i]].tolist(), float(logprob[i]), float(logprob[i]))]
        for i in range(batch)
    ]
