"""Beam search: hand-computed searches on a probability table, and invariants on a real model."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from table_model import BOS, EOS, PAD, TableModel
from transformer.decode import beam_search, greedy_search, length_penalty, max_output_lengths


def real_part(src_row: torch.Tensor) -> torch.Tensor:
    return src_row[src_row != PAD][None]


def as_tuples(hyps):
    return [(h.tokens, h.score, h.logprob) for h in hyps]


# ---- hand-computed searches on a probability table ------------------------------------------

A, B, C = 3, 4, 5  # real tokens

GREEDY_TRAP = {
    (): {A: 0.5, B: 0.4, EOS: 0.1},
    (A,): {EOS: 0.4, A: 0.35, B: 0.25},  # A A... and A EOS: best continuation 0.4
    (B,): {EOS: 0.9, A: 0.05, B: 0.05},  # B EOS = 0.4 * 0.9 = 0.36 > A EOS = 0.5 * 0.4 = 0.2
}
TRAP_DEFAULT = {EOS: 0.9, A: 0.06, B: 0.04}


def test_beam_finds_what_greedy_misses():
    model = TableModel.from_table(GREEDY_TRAP, TRAP_DEFAULT, vocab_size=5)
    src = torch.tensor([[A, B]])
    (g,) = greedy_search(model, src)[0]
    assert g.tokens == [A, EOS] and g.logprob == pytest.approx(math.log(0.2))
    hyps = beam_search(model, src, beam_size=2, alpha=0.0, n_best=2)[0]
    # step 1 keeps A (0.5) and B (0.4); step 2 ranks B EOS 0.36, A EOS 0.2, A A 0.175, A B 0.125:
    # both EOS extensions are among the best two, and no live one (<= 0.175) can beat 0.2.
    assert [h.tokens for h in hyps] == [[B, EOS], [A, EOS]]
    assert [h.logprob for h in hyps] == pytest.approx([math.log(0.36), math.log(0.2)])
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.2)])  # alpha 0: score = logprob
    # with alpha = 0.6 the two (equally long) hypotheses keep their order; scores divided by ((5+2)/6)^0.6
    hyps = beam_search(model, src, beam_size=2, alpha=0.6, n_best=2)[0]
    lp2 = (7 / 6) ** 0.6
    assert [h.tokens for h in hyps] == [[B, EOS], [A, EOS]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36) / lp2, math.log(0.2) / lp2])


# C is forced first; then EOS is the single most probable token, but C A A EOS is nearly as
# probable and, being longer, wins once the length penalty applies.
PATIENCE = {
    (): {C: 1.0},
    (C,): {EOS: 0.4, A: 0.35, B: 0.25},
    (C, A): {EOS: 0.01, A: 0.98, B: 0.01},
    (C, A, A): {EOS: 0.98, A: 0.012, B: 0.008},
}
PATIENCE_DEFAULT = {EOS: 0.9, A: 0.06, B: 0.04}
SHORT = [C, EOS]  # logprob log 0.4                       = -0.91629
LONG = [C, A, A, EOS]  # logprob log(0.35 * 0.98 * 0.98) = log 0.33614 = -1.09023


def test_with_length_penalty_search_continues_past_the_first_eos():
    """alpha = 1: lp(2) = 7/6, lp(4) = 9/6.
    SHORT scores -0.91629 / (7/6) = -0.78539; LONG scores -1.09023 / 1.5 = -0.72682.
    At step 2 SHORT is the best candidate. The live C A (log 0.35 = -1.04982) finishing at
    the next step could reach only -1.04982 / (8/6) = -0.78737 < -0.78539, but finishing
    later it can score up to -1.04982 / lp(13) = -0.34994: the search must go on, and it
    returns LONG."""
    model = TableModel.from_table(PATIENCE, PATIENCE_DEFAULT, vocab_size=6)
    src = torch.tensor([[A, A, A]])  # limit 3 + 10 = 13 tokens
    hyps = beam_search(model, src, beam_size=2, alpha=1.0, n_best=2, max_len_b=10)[0]
    assert [h.tokens for h in hyps] == [LONG, SHORT]
    assert hyps[0].logprob == pytest.approx(math.log(0.35 * 0.98 * 0.98))
    assert hyps[0].score == pytest.approx(math.log(0.35 * 0.98 * 0.98) / 1.5)
    assert hyps[0].score == pytest.approx(-0.72682, abs=1e-5)
    assert hyps[1].score == pytest.approx(math.log(0.4) / (7 / 6)) == pytest.approx(-0.78539, abs=1e-5)
    (best,) = beam_search(model, src, beam_size=2, alpha=1.0, n_best=1, max_len_b=10)[0]
    assert best.tokens == LONG


def test_without_length_penalty_the_shorter_one_wins_and_search_stops():
    """alpha = 0: SHORT (log 0.4) beats every live hypothesis (C A: log 0.35), so the search
    stops at step 2 without expanding C A."""
    model = TableModel.from_table(PATIENCE, PATIENCE_DEFAULT, vocab_size=6)
    (best,) = beam_search(model, torch.tensor([[A, A, A]]), beam_size=2, alpha=0.0, n_best=1, max_len_b=10)[0]
    assert best.tokens == SHORT
    assert best.score == best.logprob == pytest.approx(math.log(0.4))
    assert max(len(q) for q in model.queries) == 1  # never asked about anything after C
    (g,) = greedy_search(model, torch.tensor([[A, A, A]]))[0]
    assert g.tokens == SHORT


def position_probs(src, prefix):
    """Probabilities that depend on the position only; EOS nearly impossible before the limit.
    With a separable score, beam search is exact: its K best are the K most probable sequences."""
    t = len(prefix)
    w = {tok: math.exp(2 * math.sin(1.3 * tok + 0.7 * t)) for tok in range(3, 9)}
    z = sum(w.values())
    return {EOS: 1e-4, **{tok: (1 - 1e-4) * x / z for tok, x in w.items()}}


def test_n_best_at_the_length_limit_is_exact():
    model = TableModel(position_probs, vocab_size=9)
    src = torch.tensor([[3, 3, 0]])  # real length 2: limit 2 + 2 = 4 tokens, EOS forced at the 4th
    alpha, k = 0.6, 3
    hyps = beam_search(model, src, beam_size=k, alpha=alpha, n_best=k, max_len_b=2)[0]
    expected = []
    for seq in itertools.product(range(3, 9), repeat=3):
        lp = sum(math.log(position_probs((), seq[:t])[tok]) for t, tok in enumerate(seq)) + math.log(1e-4)
        expected.append((list(seq) + [EOS], lp / length_penalty(4, alpha), lp))
    expected.sort(key=lambda e: e[1], reverse=True)
    assert [h.tokens for h in hyps] == [e[0] for e in expected[:k]]
    assert [h.score for h in hyps] == pytest.approx([e[1] for e in expected[:k]], abs=1e-5)
    assert [h.logprob for h in hyps] == pytest.approx([e[2] for e in expected[:k]], abs=1e-5)


def test_default_limit_uses_the_real_source_length():
    model = TableModel(position_probs, vocab_size=9, max_len=200)
    src = torch.tensor([[3, 4, 5, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0]])
    out = beam_search(model, src, beam_size=2, n_best=2)
    assert [len(h.tokens) for h in out[0]] == [53, 53]
    assert [len(h.tokens) for h in out[1]] == [51, 51]


def test_pad_and_bos_are_never_generated():
    model = TableModel(lambda src, prefix: {PAD: 0.4, BOS: 0.3, A: 0.1, B: 0.05, EOS: 0.15}, vocab_size=5)
    for k in (1, 2, 4):
        for h in beam_search(model, torch.tensor([[A, A]]), beam_size=k, n_best=k, alpha=0.0)[0]:
            assert PAD not in h.tokens and BOS not in h.tokens and h.tokens[-1] == EOS
    # the best is EOS alone (0.15), then A EOS (0.1 * 0.15)
    hyps = beam_search(model, torch.tensor([[A, A]]), beam_size=2, n_best=2, alpha=0.0)[0]
    assert [h.tokens for h in hyps] == [[EOS], [A, EOS]]


def test_only_one_beam_is_seeded():
    """At step 0 the K start rows are identical; if all were live, the n-best list would hold
    K copies of the same hypothesis."""
    model = TableModel.from_table({(): {A: 0.7, B: 0.2, EOS: 0.1}}, {EOS: 0.8, A: 0.1, B: 0.1}, vocab_size=5)
    hyps = beam_search(model, torch.tensor([[A]]), beam_size=3, n_best=3, alpha=0.0)[0]
    tokens = [tuple(h.tokens) for h in hyps]
    assert len(set(tokens)) == 3
    assert tokens[0] == (A, EOS) and hyps[0].logprob == pytest.approx(math.log(0.56))


def test_n_best_larger_than_beam_is_an_error(decoder_model):
    with pytest.raises(ValueError, match="n_best"):
        beam_search(decoder_model, torch.tensor([[3, 4]]), beam_size=2, n_best=3)


# ---- invariants on a real tiny model -------------------------------------------------------

@torch.no_grad()
def teacher_forced_logprob(model, src_row, tokens):
    src = real_part(src_row)
    tgt_in = torch.tensor([[BOS] + tokens[:-1]])
    lp = torch.log_softmax(model(src, tgt_in)[0], -1)
    return float(lp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def test_beam_of_one_is_greedy(decoder_model, ragged_src):
    greedy = greedy_search(decoder_model, ragged_src, max_len_b=6)
    beam = beam_search(decoder_model, ragged_src, beam_size=1, alpha=0.0, max_len_b=6)
    for (g,), (b,) in zip(greedy, beam):
        assert b.tokens == g.tokens
        assert b.logprob == pytest.approx(g.logprob, abs=1e-4)


@pytest.mark.parametrize("k,n_best", [(1, 1), (2, 2), (3, 1), (4, 4), (5, 3)])
def test_sentence_alone_or_in_a_padded_batch_gives_the_same_beam(decoder_model, ragged_src, k, n_best):
    batch = beam_search(decoder_model, ragged_src, beam_size=k, n_best=n_best, max_len_b=6)
    for i in range(ragged_src.size(0)):
        alone = real_part(ragged_src[i])
        for src in (alone, F.pad(alone, (0, 6))):
            hyps = beam_search(decoder_model, src, beam_size=k, n_best=n_best, max_len_b=6)[0]
            assert [h.tokens for h in hyps] == [h.tokens for h in batch[i]]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in batch[i]], abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_hypotheses_are_well_formed_and_scored(decoder_model, ragged_src, alpha):
    k = 4
    limits = max_output_lengths(ragged_src, decoder_model.cfg, 1.0, 6)
    out = beam_search(decoder_model, ragged_src, beam_size=k, n_best=k, alpha=alpha, max_len_b=6)
    lengths = set()
    for i, hyps in enumerate(out):
        assert len(hyps) == k
        assert len({tuple(h.tokens) for h in hyps}) == k
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:
            assert h.tokens[-1] == EOS and h.tokens.count(EOS) == 1
            assert PAD not in h.tokens and BOS not in h.tokens
            assert len(h.tokens) <= limits[i]
            assert h.score == pytest.approx(h.logprob / ((5 + len(h.tokens)) / 6) ** alpha, rel=1e-6)
            assert h.logprob == pytest.approx(teacher_forced_logprob(decoder_model, ragged_src[i], h.tokens), abs=1e-4)
            lengths.add(len(h.tokens))
    assert len(lengths) >= 3  # hypotheses of several lengths were compared


def test_n_best_when_every_hypothesis_hits_the_limit(decoder_model, ragged_src):
    """max_len_a = 0, max_len_b = 2: every sentence may produce 2 tokens (EOS forced at the 2nd)."""
    out = beam_search(decoder_model, ragged_src, beam_size=4, n_best=4, alpha=0.6, max_len_a=0.0, max_len_b=2)
    for i, hyps in enumerate(out):
        assert len(hyps) == 4
        assert all(len(h.tokens) <= 2 and h.tokens[-1] == EOS for h in hyps)
        assert any(len(h.tokens) == 2 for h in hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    out = beam_search(decoder_model, ragged_src, beam_size=3, n_best=3, max_len_a=0.0, max_len_b=1)
    assert all([h.tokens for h in hyps] == [[EOS]] for hyps in out)  # only EOS fits; n-best holds what exists


def test_extra_padding_never_changes_the_beam(decoder_model, ragged_src):
    a = beam_search(decoder_model, ragged_src, beam_size=3, n_best=2, max_len_b=6)
    b = beam_search(decoder_model, F.pad(ragged_src, (0, 7)), beam_size=3, n_best=2, max_len_b=6)
    assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]
    for ha, hb in zip(a, b):
        assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=1e-5)


@pytest.mark.parametrize("eos_bias", [-0.5, 2.0])
@pytest.mark.parametrize("k, n_best, alpha, min_length", [(4, 1, 0.6, 0), (4, 3, 0.6, 0), (3, 2, 0.0, 0),
                                                          (5, 5, 1.0, 3), (2, 1, 0.6, 0)])
def test_beam_fast_equals_reference(make_model, rand_tokens, eos_bias, k, n_best, alpha, min_length):
    """The vectorised stopping rule returns exactly what the per-sentence loop returns:
    same tokens, same scores, same order, for sentences that stop early and at the limit."""
    from reference_beam import reference_beam_search

    model = make_model(seed=2, output_bias=True)
    with torch.no_grad():
        model.out_bias[model.cfg.eos_id] = eos_bias
    src = rand_tokens([7, 2, 5, 1, 4, 9, 3, 6], width=9)
    args = dict(beam_size=k, n_best=n_best, alpha=alpha, min_length=min_length, max_len_b=12)
    fast = beam_search(model, src, **args)
    slow = reference_beam_search(model, src, **args)
    assert [as_tuples(h) for h in fast] == [as_tuples(h) for h in slow]
    assert any(len(h[0].tokens) < 10 for h in fast)  # some sentences stop before their limit


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("k,n_best", [(1, 1), (4, 2)])
def test_weights_that_give_no_finite_score_end_each_sentence_with_one_hypothesis(decoder_model, ragged_src, bad,
                                                                                 k, n_best):
    """One NaN (or infinity) in a cross-attention bias makes every score NaN: no hypothesis
    could finish (only finite ones do), every sentence came back with none, and the callers'
    hyps[0] was an IndexError. Now each sentence stops at once with its best beam, scored NaN."""
    with torch.no_grad():
        decoder_model.decoder.layers[0].cross_attn.k_proj.bias[0] = bad
    out = beam_search(decoder_model, ragged_src, beam_size=k, n_best=n_best, max_len_b=6)
    assert len(out) == ragged_src.size(0)
    for hyps in out:
        assert len(hyps) == 1 and hyps[0].tokens == [EOS] and math.isnan(hyps[0].score)


def test_a_sentence_whose_scores_go_nan_stops_while_the_others_decode_as_before(decoder_model, ragged_src):
    """A step that gives NaN for one sentence's rows only: that sentence ends with its best
    beam, the others are the search's own, as in a batch of their own."""
    from transformer.decode.eager_step import EagerStep

    clean = beam_search(decoder_model, ragged_src[1:], beam_size=3, n_best=2, max_len_b=6)

    class NanForTheFirst(EagerStep):
        calls = 0

        def __call__(self, last, cache, top=None):  # noqa: ARG002 (the whole rows, to poison)
            lp, cache = super().__call__(last, cache)
            self.calls += 1
            if self.calls == 1:  # the first sentence's K rows, at the first step (it ends there)
                lp[:3] = float("nan")
            return lp, cache

    out = beam_search(decoder_model, ragged_src, beam_size=3, n_best=2, max_len_b=6, step=NanForTheFirst(decoder_model))
    assert len(out[0]) == 1 and math.isnan(out[0][0].score)
    assert [[h.tokens for h in hyps] for hyps in out[1:]] == [[h.tokens for h in hyps] for hyps in clean]
