"""Beam search, batched, on the KV cache.

Each sentence keeps ``beam_size`` live hypotheses. At every step the 2K best extensions
are ranked; EOS extensions among the first K become finished hypotheses (scored with the
GNMT length penalty), and the K best non-EOS extensions stay live. Rows are reordered with
one ``index_select`` on the cache per step.

Stopping (per sentence): when it holds ``n_best`` finished hypotheses and no live one can
still beat the n-th best of them. With a length penalty, a live hypothesis's score can
*rise* as it grows (logprob / lp(len), lp growing), so the bound uses the best score it
could reach at any length up to the limit, not its current score. At the length limit EOS
is forced, so every sentence returns n-best even then. A sentence with no finite candidate
left (weights that give NaN) stops at once, returning its best beam if nothing finished.

Written once over a step (:mod:`transformer.decode.eager_step`): eager on the growing cache
unless it is handed another (a compiled one on a fixed-shape cache).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .eager_step import EagerStep
from .rows import expand_rows
from .scoring import Hypothesis, best_of_rows, length_penalty, max_output_lengths


def _best_reachable(raw: Tensor, step: int, limit_lp: Tensor, alpha: float, norm: str = "gnmt") -> Tensor:
    """The highest normalised score each live hypothesis with log-prob ``raw`` (which can only
    fall) could reach by finishing at some length in (step, limit]; ``limit_lp`` is the
    length penalty at each one's limit (either penalty grows with the length, so the best is
    at one end). All float64, so the ranking matches Python floats."""
    return torch.maximum(raw / length_penalty(step + 1, alpha, norm), raw / limit_lp)


@torch.inference_mode()
def beam_search(
    model,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    n_best: int = 1,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    min_length: int = 0,
    step=None,
    length_norm: str = "gnmt",
) -> list[list[Hypothesis]]:
    """Decode a batch with beam search.

    Args:
        model: a :class:`~transformer.Transformer` in eval mode.
        src: (B, S) source ids, right-padded.
        beam_size: K, live hypotheses per sentence.
        alpha: length-penalty exponent (0.6 in the paper; 0 = raw log-probability).
        length_norm: ``gnmt``, scores divided by ((5 + |Y|) / 6) ** alpha (the paper's
            reference, GNMT), or ``length``, by |Y| ** alpha (Hugging Face, fairseq).
        n_best: hypotheses returned per sentence (1 <= n_best <= K).
        max_len_a, max_len_b: at most a * src_len + b tokens per sentence (EOS included).
        min_length: EOS is blocked before this many tokens (EOS included); the length
            limit wins where the two disagree.
        step: the step every position is decoded by (:mod:`transformer.decode.eager_step`;
            default: the model's own ``decode``, eagerly), returning log-probabilities, for
            ``beam_size`` rows per sentence.

    Returns:
        For each sentence, its ``n_best`` hypotheses, best first.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), got {n_best}")
    limits = max_output_lengths(src, model.cfg, max_len_a, max_len_b)
    step = EagerStep(model) if step is None else step
    # row = b*K + j; the K rows of a sentence share its cross-attention K/V
    cache = expand_rows(model.start_cache(model.encode(src), src), beam_size)
    return decode_beams(step, cache, limits, model.cfg, beam_size, alpha, n_best, min_length, length_norm)


def decode_beams(step, cache, limits: Tensor, cfg, k: int, alpha: float = 0.6, n_best: int = 1,
                 min_length: int = 0, length_norm: str = "gnmt") -> list[list[Hypothesis]]:
    """Beam search through ``step`` (:mod:`transformer.decode.eager_step`) from ``cache`` (the
    model's after the encoder, ``expand``-ed to ``k`` rows per sentence). The cache holds
    the rows of the sentences in ``placed``; a finished sentence's rows stay there, unread,
    until the step drops finished rows (the eager step at once; a compiled one when half the
    sentences are done, so that it runs at a few batch sizes only)."""
    vocab = cfg.target_vocab_size
    batch, device = limits.size(0), limits.device
    cache = step.start(cache, int(limits.max()))
    placed = torch.arange(batch, device=device)  # the sentence of each group of K rows in the cache
    every_last = torch.full((batch, k), cfg.eos_id, dtype=torch.long, device=device)  # finished rows: anything

    alive = torch.arange(batch, device=device)  # sentence index of each group of K rows
    seqs = torch.empty((batch * k, 0), dtype=torch.long, device=device)  # generated ids, no BOS, no EOS
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # only one beam starts: the K start rows are identical
    last = torch.full((batch * k, 1), cfg.bos_id, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    has_final = torch.zeros(batch, dtype=torch.bool, device=device)  # (the host's finished, kept on the device)
    # The n-th best finished score of each sentence (-inf until it has n_best), float64, and
    # the length penalty at each sentence's limit, from Python floats like the scores.
    nth_best = torch.full((batch,), float("-inf"), dtype=torch.float64, device=device)
    limit_lp = torch.tensor([length_penalty(n, alpha, length_norm) for n in limits.tolist()], dtype=torch.float64,
                            device=device)
    step_i = 0
    while alive.numel() > 0:
        step_i += 1
        n_alive = alive.numel()
        # every placed row steps; the alive sentences' rows are read
        at = torch.searchsorted(placed, alive)  # their groups in the cache (both sorted)
        every_last[at] = last.view(n_alive, k)
        # The 2K best extensions of a sentence are among the 2K best of each of its beams
        # (a beam's score is a constant shift of its row), so rank each row first and the
        # K x 2K survivors then, instead of adding the scores to all K x V candidates; the
        # step is asked for one more a row, in case EOS, blocked, is among them.
        n_top = min(2 * k, vocab)
        lp, cache = step(every_last.view(-1, 1), cache, top=n_top + 1)  # (P*K, V) log-probabilities, or a RowTop
        if n_alive < placed.numel():  # (else `at` is every group, in order)
            lp = lp.index_select(0, (at[:, None] * k + torch.arange(k, device=device)).view(-1))
        at_limit = limits[alive] <= step_i  # (A,)
        row_lp, row_tok = best_of_rows(lp, n_top, cfg.eos_id, step_i < min_length,
                                       at_limit.repeat_interleave(k))  # (A*K, n_top)
        cand = (scores[:, :, None] + row_lp.view(n_alive, k, n_top)).view(n_alive, k * n_top)
        top_scores, top_idx = cand.topk(min(2 * k, k * n_top), dim=1)  # (A, 2K)
        top_beam = top_idx // n_top
        top_tok = row_tok.view(n_alive, k * n_top).gather(1, top_idx)
        is_eos = top_tok == cfg.eos_id

        # EOS among the K best candidates: a finished hypothesis. A sentence none of whose
        # candidates has a finite score (weights that give NaN) can never finish one, as no
        # log-probability brings NaN or -inf back: it ends now, its best beam (non-finite
        # score) its hypothesis when it has none, so that every sentence returns one.
        finite = torch.isfinite(top_scores)
        hopeless = ~finite.any(1)
        new_final = is_eos[:, :k] & finite[:, :k]
        new_final[:, 0] |= hopeless & ~has_final[alive]
        ended = new_final.nonzero()  # (F, 2), one wait for the device: the new hypotheses
        if ended.numel():
            touched = set()
            a, j = ended.unbind(1)  # (read back together below)
            has_final[alive[a]] = True
            their_ids = seqs.index_select(0, a * k + top_beam[a, j])
            for b, raw, ids in zip(alive[a].tolist(), top_scores[a, j].tolist(), their_ids.tolist()):
                finished[b].append(Hypothesis(ids + [cfg.eos_id], raw / length_penalty(step_i, alpha, length_norm),
                                              raw))
                touched.add(b)
            for b in touched:
                if len(finished[b]) >= n_best:
                    nth_best[b] = sorted((h.score for h in finished[b]), reverse=True)[n_best - 1]

        # The K best non-EOS candidates stay live (a stable sort keeps score order).
        pick = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :k]
        scores = top_scores.gather(1, pick)
        beam_of = top_beam.gather(1, pick)
        tok = top_tok.gather(1, pick)

        # A sentence is done at its limit, or when its best live hypothesis cannot beat its
        # n-th best finished one (never while it has fewer than n_best: nth_best is -inf).
        best_live = _best_reachable(scores[:, 0].double(), step_i, limit_lp[alive], alpha, length_norm)
        nth = nth_best[alive]
        keep_t = ~(at_limit | hopeless | (torch.isfinite(nth) & (best_live <= nth)))

        # The cache's rows move with their beams: row i of an alive sentence's group takes
        # the contents of the row its beam came from; other groups stay as they are.
        # (kept as indices, found once: every boolean-mask index would wait for the device again)
        kept = keep_t.nonzero().squeeze(1)
        groups = at[kept]
        order = torch.arange(placed.numel() * k, device=device).view(-1, k)
        order[groups] = (at[:, None] * k + beam_of)[kept]
        if step.drops(kept.numel(), placed.numel()):  # and the finished sentences' rows leave
            cache = step.keep(cache, order[groups].view(-1))
            placed, every_last = alive[kept], every_last[groups]
        else:
            cache = step.keep(cache, order.view(-1))
        rows = (torch.arange(n_alive, device=device)[:, None] * k + beam_of)[kept].view(-1)  # (A', K) in seqs
        tok, scores = tok[kept].view(-1, 1), scores[kept]
        alive = alive[kept]
        seqs = torch.cat([seqs.index_select(0, rows), tok], dim=1)
        last = tok

    return [sorted(f, key=lambda h: h.score, reverse=True)[:n_best] for f in finished]
