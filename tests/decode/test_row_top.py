"""The searches read each row's best few scores from the eager step (``top=``), the vocabulary
projected a chunk of rows at a time: the same hypotheses as ranking the whole (N, V) scores."""
from __future__ import annotations

import pytest
import torch

from transformer.decode import beam_search, greedy_search
from transformer.decode import scoring
from transformer.decode.eager_step import EagerStep
from transformer.decode.scoring import RowTop, best_of_rows, next_token_logprobs, row_top


ONE_CHUNK = scoring.CHUNK_VALUES  # (every test batch fits one chunk)


class WholeRows(EagerStep):
    """The eager step as it was: the (N, V) log-probabilities, whatever ``top`` asks."""

    def __call__(self, tokens, cache, top=None):  # noqa: ARG002
        return super().__call__(tokens, cache)


def as_tuples(found):
    return [[(h.tokens, h.score, h.logprob) for h in hyps] for hyps in found]


@pytest.mark.parametrize("chunk_values", [ONE_CHUNK, 64])
@pytest.mark.parametrize("beam,min_length,max_len_b", [(1, 0, 6), (1, 4, 3), (3, 0, 6), (3, 5, 4), (4, 2, 9)])
def test_the_best_few_give_the_hypotheses_of_the_whole_rows(decoder_model, ragged_src, monkeypatch,
                                                            chunk_values, beam, min_length, max_len_b):
    # min_length over the limit (EOS blocked and forced at once) and a chunk of one or two rows included
    monkeypatch.setattr(scoring, "CHUNK_VALUES", chunk_values)
    model = decoder_model.eval()
    whole, ranked = WholeRows(model), EagerStep(model)
    if beam == 1:
        want = greedy_search(model, ragged_src, max_len_b=max_len_b, min_length=min_length, step=whole)
        got = greedy_search(model, ragged_src, max_len_b=max_len_b, min_length=min_length, step=ranked)
    else:
        kw = dict(beam_size=beam, n_best=min(2, beam), max_len_b=max_len_b, min_length=min_length)
        want = beam_search(model, ragged_src, step=whole, **kw)
        got = beam_search(model, ragged_src, step=ranked, **kw)
    if chunk_values == ONE_CHUNK:  # one chunk: the same bits
        assert as_tuples(got) == as_tuples(want)
    else:  # a product of fewer rows may round differently (the GEMM's blocking), in the last bits
        assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
        for hyps, ref in zip(got, want):
            assert [h.score for h in hyps] == pytest.approx([h.score for h in ref], rel=1e-5)


def test_row_top_is_the_top_of_the_whole_log_probabilities_in_chunks(make_model, monkeypatch):
    model = make_model(seed=3).eval()
    cfg = model.cfg
    h = torch.randn(7, cfg.d_model)
    full = next_token_logprobs(model.project(h), cfg)
    calls = []

    def project(part):
        calls.append(part.size(0))
        return model.project(part)

    monkeypatch.setattr(scoring, "CHUNK_VALUES", 2 * cfg.target_vocab_size)  # two rows a chunk
    top = row_top(h, project, cfg, 5)
    assert calls == [2, 2, 2, 1]  # never the seven rows at once
    values, tokens = full.topk(5, dim=1)
    torch.testing.assert_close(top.values, values, rtol=0, atol=1e-5)
    assert torch.equal(top.tokens, tokens)
    torch.testing.assert_close(top.eos, full[:, cfg.eos_id], rtol=0, atol=1e-5)


def test_eos_blocked_and_forced_alike_on_either_form():
    torch.manual_seed(0)
    eos, n = 2, 3
    lp = torch.log_softmax(torch.randn(6, 11), dim=1)
    lp[0, eos] = 5.0  # EOS the best of row 0 and among the n + 1 of every row
    lp[1:, eos] = lp[1:].amax(1) - 1e-3
    at_limit = torch.tensor([False, True, False, True, False, False])
    for block in (False, True):
        values, tokens = lp.topk(n + 1, dim=1)
        top = RowTop(values, tokens, lp[:, eos].clone())
        got = best_of_rows(top, n, eos, block, at_limit)
        want = best_of_rows(lp.clone(), n, eos, block, at_limit)
        live = ~at_limit  # a forced row: EOS first, the others -inf whatever their token
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1][live], want[1][live])
        if not block:  # (blocked and forced, a row is all -inf: no token is read)
            assert torch.equal(got[1][at_limit, 0], want[1][at_limit, 0])
        else:
            assert torch.isinf(got[0][at_limit]).all()
        assert (got[1][live] == eos).any() != block


def test_log_probabilities_written_over_their_logits_are_the_same_numbers(make_model):
    cfg = make_model(seed=4).cfg
    logits = torch.randn(5, cfg.target_vocab_size) * 4
    want = next_token_logprobs(logits, cfg)
    mine = logits.clone()
    got = next_token_logprobs(mine, cfg, overwrite=True)
    assert got.data_ptr() == mine.data_ptr()  # no second (N, V) tensor
    assert torch.equal(got, want)
    bf16 = logits.bfloat16()  # another dtype: a float32 tensor of its own, the logits untouched
    assert torch.equal(next_token_logprobs(bf16, cfg, overwrite=True), next_token_logprobs(bf16, cfg))
    assert torch.equal(bf16, logits.bfloat16())
