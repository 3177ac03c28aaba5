"""The unoptimised beam search, kept as the oracle for the fast one in
``transformer.decode.beam``: it decides per sentence, in a Python loop, whether the search
is over. ``test_beam_fast_equals_reference`` checks that both return the same hypotheses.
"""
from __future__ import annotations

import torch
from torch import Tensor

from transformer.decode.scoring import Hypothesis, force_eos, length_penalty, max_output_lengths, next_token_logprobs
from transformer.decode.rows import expand_rows, select_rows


def _best_reachable(raw: float, step: int, limit: int, alpha: float) -> float:
    """The highest normalised score a live hypothesis with log-prob ``raw`` (which can only
    fall) could reach by finishing at some length in (step, limit]."""
    if raw == float("-inf"):
        return raw
    return max(raw / length_penalty(step + 1, alpha), raw / length_penalty(limit, alpha))


@torch.no_grad()
def reference_beam_search(
    model,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    n_best: int = 1,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_length: int = 0,
) -> list[list[Hypothesis]]:
    """Decode a batch with beam search.

    Args:
        model: a :class:`~transformer.Transformer` in eval mode.
        src: (B, S) source ids, right-padded.
        beam_size: K, live hypotheses per sentence.
        alpha: length-penalty exponent (0.6 in the paper; 0 = raw log-probability).
        n_best: hypotheses returned per sentence (1 <= n_best <= K).
        max_len_a, max_len_b: at most a * src_len + b tokens per sentence (EOS included).
        min_length: EOS is blocked before this many tokens (EOS included); the length
            limit wins where the two disagree.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), got {n_best}")
    cfg = model.cfg
    k, vocab = beam_size, cfg.target_vocab_size
    batch, device = src.size(0), src.device
    limits = max_output_lengths(src, cfg, max_len_a, max_len_b)
    cache = model.start_cache(model.encode(src), src)
    cache = expand_rows(cache, k)  # row = b*K + j; the K rows of a sentence share its cross-attention K/V

    alive = torch.arange(batch, device=device)  # sentence index of each group of K rows
    seqs = torch.empty((batch * k, 0), dtype=torch.long, device=device)  # generated ids, no BOS, no EOS
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # only one beam starts: the K start rows are identical
    last = torch.full((batch * k, 1), cfg.bos_id, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    step = 0
    while alive.numel() > 0:
        step += 1
        n_alive = alive.numel()
        logits, cache = model.decode(last, cache)
        lp = next_token_logprobs(logits[:, -1], cfg)  # (A*K, V)
        if step < min_length:
            lp[:, cfg.eos_id] = float("-inf")
        at_limit = limits[alive] <= step  # (A,)
        force_eos(lp, at_limit.repeat_interleave(k), cfg.eos_id)

        cand = (scores[:, :, None] + lp.view(n_alive, k, vocab)).view(n_alive, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)  # (A, 2K)
        top_beam, top_tok = top_idx // vocab, top_idx % vocab
        is_eos = top_tok == cfg.eos_id

        # EOS among the K best candidates: a finished hypothesis.
        new_final = is_eos[:, :k] & torch.isfinite(top_scores[:, :k])
        for a, j in new_final.nonzero().tolist():
            row = a * k + int(top_beam[a, j])
            raw = float(top_scores[a, j])
            finished[int(alive[a])].append(Hypothesis(
                seqs[row].tolist() + [cfg.eos_id], raw / length_penalty(step, alpha), raw))

        # The K best non-EOS candidates stay live (a stable sort keeps score order).
        pick = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :k]
        scores = top_scores.gather(1, pick)
        beam_of = top_beam.gather(1, pick)
        tok = top_tok.gather(1, pick)

        keep = []
        for a in range(n_alive):
            b = int(alive[a])
            done = bool(at_limit[a])
            if not done and len(finished[b]) >= n_best:
                nth = sorted((h.score for h in finished[b]), reverse=True)[n_best - 1]
                best_live = _best_reachable(float(scores[a, 0]), step, int(limits[b]), alpha)
                done = best_live <= nth
            keep.append(not done)
        keep_t = torch.tensor(keep, dtype=torch.bool, device=device)

        rows = (torch.arange(n_alive, device=device)[:, None] * k + beam_of)  # (A, K) source rows
        rows, tok, scores = rows[keep_t].view(-1), tok[keep_t].view(-1, 1), scores[keep_t]
        alive = alive[keep_t]
        seqs = torch.cat([seqs.index_select(0, rows), tok], dim=1)
        cache = select_rows(cache, rows)
        last = tok

    return [sorted(f, key=lambda h: h.score, reverse=True)[:n_best] for f in finished]
