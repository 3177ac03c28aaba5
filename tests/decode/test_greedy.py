"""Greedy search: the argmax path, on the cache, batched, with length limits."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from table_model import BOS, EOS, PAD, TableModel
from transformer.decode import greedy_search, max_output_lengths


@torch.no_grad()
def reference_greedy(model, src_row: torch.Tensor, limit: int) -> tuple[list[int], float]:
    """One sentence, no cache, no batching: re-run the full model on the whole prefix."""
    cfg = model.cfg
    src = src_row[src_row != cfg.pad_id][None]
    ys, total = [cfg.bos_id], 0.0
    for step in range(1, limit + 1):
        lp = torch.log_softmax(model(src, torch.tensor([ys]))[0, -1], -1)
        lp[[cfg.pad_id, cfg.bos_id]] = -math.inf
        tok = cfg.eos_id if step == limit else int(lp.argmax())
        total += float(lp[tok])
        ys.append(tok)
        if tok == cfg.eos_id:
            break
    return ys[1:], total


def test_greedy_equals_the_uncached_reference(decoder_model, ragged_src):
    limits = max_output_lengths(ragged_src, decoder_model.cfg, 1.0, 6)
    hyps = greedy_search(decoder_model, ragged_src, max_len_b=6)
    assert len(hyps) == ragged_src.size(0)
    for i, (h,) in enumerate(hyps):
        tokens, logprob = reference_greedy(decoder_model, ragged_src[i], int(limits[i]))
        assert h.tokens == tokens
        assert h.logprob == pytest.approx(logprob, abs=1e-4) and h.score == h.logprob


def test_greedy_ends_sentences_at_different_steps(make_model, rand_tokens):
    model = make_model(seed=2, output_bias=True)  # EOS bias 0: some sentences stop early, some at the limit
    src = rand_tokens([7, 7, 7, 7, 7, 7])
    hyps = [h[0] for h in greedy_search(model, src, max_len_b=10)]
    lengths = {len(h.tokens) for h in hyps}
    assert 17 in lengths and min(lengths) < 17  # both kinds are present, so the test below means something
    for i, h in enumerate(hyps):
        assert h.tokens == reference_greedy(model, src[i], 17)[0]


def test_decoding_starts_from_bos_even_when_it_is_the_pad_id(make_model, ragged_src):
    """HF Marian's layout: decoding starts from the pad id. Token 1 is then an ordinary token."""
    model = make_model(seed=2, pad_id=0, bos_id=0, eos_id=2)
    limits = max_output_lengths(ragged_src, model.cfg, 1.0, 6)
    for i, (h,) in enumerate(greedy_search(model, ragged_src, max_len_b=6)):
        assert h.tokens == reference_greedy(model, ragged_src[i], int(limits[i]))[0]
        assert 0 not in h.tokens


def test_one_eos_at_the_end_and_never_pad_or_bos(decoder_model, ragged_src):
    for (h,) in greedy_search(decoder_model, ragged_src, max_len_b=4):
        assert h.tokens[-1] == EOS and h.tokens.count(EOS) == 1
        assert PAD not in h.tokens and BOS not in h.tokens


def test_batch_and_padding_do_not_change_the_output(decoder_model, ragged_src):
    batch = greedy_search(decoder_model, ragged_src, max_len_b=6)
    for i in range(ragged_src.size(0)):
        real = ragged_src[i][ragged_src[i] != 0][None]
        for src in (real, F.pad(real, (0, 5))):
            (alone,) = greedy_search(decoder_model, src, max_len_b=6)
            assert alone[0].tokens == batch[i][0].tokens
            assert alone[0].logprob == pytest.approx(batch[i][0].logprob, abs=1e-5)


def never_eos(src, prefix):
    return {EOS: 1e-6, 3: 0.5, 4: 0.5 - 1e-6}


def test_default_limit_is_real_source_length_plus_50():
    model = TableModel(never_eos, vocab_size=5, max_len=200)
    src = torch.tensor([[3, 4, 3, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4]])
    a, b = greedy_search(model, src)
    assert len(a[0].tokens) == 53 and len(b[0].tokens) == 57
    assert a[0].tokens[-1] == EOS and EOS not in a[0].tokens[:-1]


def test_pad_and_bos_are_never_generated_even_when_most_probable():
    def probs(src, prefix):  # PAD and BOS hold most of the mass; EOS rises after two tokens
        if len(prefix) < 2:
            return {PAD: 0.5, BOS: 0.3, 3: 0.05, 4: 0.1, EOS: 0.05}
        return {PAD: 0.5, BOS: 0.2, 3: 0.05, 4: 0.1, EOS: 0.15}

    model = TableModel(probs, vocab_size=5)
    (h,) = greedy_search(model, torch.tensor([[3, 3]]))[0]
    assert h.tokens == [4, 4, EOS]
    assert h.logprob == pytest.approx(math.log(0.1 * 0.1 * 0.15))
