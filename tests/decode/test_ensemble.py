"""Ensembles: a hand-computed search over two probability tables, the step log-probabilities
against the members' full forward passes, and the search invariants on real models."""
from __future__ import annotations

import math

import pytest
import torch

from table_model import EOS, TableModel
from transformer.decode import Ensemble, beam_search, greedy_search
from transformer.decode.int8 import Int8Linear
from transformer.decode.precision import for_inference

# Member A prefers token 3, member B token 4; on average token 5 is the most probable.
A_FIRST = {3: 0.5, 5: 0.4, 4: 0.1}
B_FIRST = {4: 0.5, 5: 0.4, 3: 0.1}
THEN_EOS = {EOS: 0.8, 3: 0.1, 4: 0.1}


def table(first):
    return TableModel.from_table({(): first}, THEN_EOS, vocab_size=6)


def test_ensemble_averages_probabilities_not_log_probabilities():
    src = torch.tensor([[3, 4]])
    assert greedy_search(table(A_FIRST), src)[0][0].tokens == [3, EOS]
    assert greedy_search(table(B_FIRST), src)[0][0].tokens == [4, EOS]
    (h,) = greedy_search(Ensemble([table(A_FIRST), table(B_FIRST)]), src)[0]
    assert h.tokens == [5, EOS]  # mean probability 0.4 against 0.3 and 0.3
    assert h.logprob == pytest.approx(math.log(0.4) + math.log(0.8), abs=1e-6)
    # a geometric mean (averaged log-probabilities) would rank 5 first too, but score it
    # log(0.4); tokens 3 and 4 would get log(sqrt(0.05)) instead of log(0.3)
    hyps = beam_search(Ensemble([table(A_FIRST), table(B_FIRST)]), src, beam_size=3, alpha=0.0, n_best=3)[0]
    assert [x.tokens for x in hyps] == [[5, EOS], [3, EOS], [4, EOS]]
    assert [x.logprob for x in hyps] == pytest.approx([math.log(0.4 * 0.8), math.log(0.3 * 0.8), math.log(0.3 * 0.8)],
                                                      abs=1e-6)


def test_decode_steps_match_the_members_full_forward(make_model, rand_tokens):
    """Step by step through the ensemble's cache (beam-style reordering included), each
    position's output is log(mean softmax) of the members' uncached forward passes."""
    members = [make_model(seed=3), make_model(seed=4, norm_first=True), make_model(seed=5, tie_embeddings=False, output_bias=True)]
    ens = Ensemble(members).eval()
    src = rand_tokens([6, 3, 5])
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), rand_tokens([5, 5, 5])], dim=1)
    order = torch.tensor([2, 0, 1])  # rows reordered after the second step
    with torch.inference_mode():
        cache = ens.start_cache(ens.encode(src), src)
        rows, outputs = torch.arange(3), []
        for t in range(tgt.size(1)):
            if t == 2:
                rows, cache = rows[order], cache.index_select(order)
            out, cache = ens.decode(tgt[rows, t:t + 1], cache)
            outputs.append((rows.clone(), out[:, 0]))
        assert cache.length == tgt.size(1)
        probs = torch.stack([torch.softmax(m(src, tgt).float(), dim=-1) for m in members]).mean(0)
    for t, (rows, out) in enumerate(outputs):
        torch.testing.assert_close(out, probs.log()[rows, t], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(outputs[0][1]).all()


def test_ensemble_of_one_and_of_copies_is_the_model(make_model, rand_tokens):
    model = make_model(seed=6)
    src = rand_tokens([7, 2, 5, 4])
    alone = beam_search(model, src, beam_size=4, alpha=0.6, n_best=2)
    for ens in (Ensemble([model]), Ensemble([model, make_model(seed=6)])):
        hyps = beam_search(ens, src, beam_size=4, alpha=0.6, n_best=2)
        assert [[h.tokens for h in s] for s in hyps] == [[h.tokens for h in s] for s in alone]
        assert [h.score for s in hyps for h in s] == pytest.approx([h.score for s in alone for h in s], abs=1e-4)
    assert greedy_search(Ensemble([model, model]), src)[0][0].tokens == greedy_search(model, src)[0][0].tokens


def test_beam_search_on_an_ensemble_is_independent_of_the_batch(make_model, rand_tokens):
    ens = Ensemble([make_model(seed=7), make_model(seed=8)])
    src = rand_tokens([7, 2, 5, 1, 4], width=9)
    together = beam_search(ens, src, beam_size=3, alpha=1.0, n_best=3)
    for i in range(src.size(0)):
        alone = beam_search(ens, src[i:i + 1, : int((src[i] != 0).sum())], beam_size=3, alpha=1.0, n_best=3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], abs=1e-4)


def test_members_must_share_the_vocabulary(make_model):
    with pytest.raises(ValueError, match="member 1 has target_vocab_size 11"):
        Ensemble([make_model(), make_model(tie_embeddings=False, tgt_vocab_size=11)])
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])
    ens = Ensemble([make_model(max_len=64), make_model(max_len=20)])
    assert ens.cfg.max_len == 20  # length limits follow the shortest positional table


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_precision_converts_every_member(make_model, rand_tokens, precision):
    members = [make_model(seed=1), make_model(seed=2)]
    low = for_inference(Ensemble(members), precision)
    assert isinstance(low, Ensemble) and all(m is not o for m, o in zip(low.members, members))
    if precision == "bf16":
        assert all({p.dtype for p in m.parameters()} == {torch.bfloat16} for m in low.members)
    else:  # each tied member got its own quantised projection
        assert all(isinstance(m.out_proj, Int8Linear) for m in low.members)
    assert all(m.out_proj is None for m in members)  # the caller's members are untouched
    src = rand_tokens([5, 3])
    assert [len(s) for s in beam_search(low, src, beam_size=2, alpha=0.6)] == [1, 1]
