"""Length limits, the length penalty and the helpers greedy and beam search share."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from transformer import ModelConfig
from transformer.decode import length_batches, length_penalty, max_output_lengths, pad_batch
from transformer.decode.scoring import force_eos, next_token_logprobs

CFG = ModelConfig(vocab_size=10, d_model=8, n_heads=2, max_len=40)


def test_default_limit_is_real_source_length_plus_50():
    src = torch.tensor([[5, 6, 7, 0, 0, 0], [5, 0, 0, 0, 0, 0], [5, 6, 7, 8, 9, 4]])
    cfg = CFG.replace(max_len=1000)
    assert max_output_lengths(src, cfg).tolist() == [53, 51, 56]
    # padding never changes a sentence's limit
    wide = torch.nn.functional.pad(src, (0, 20))
    assert max_output_lengths(wide, cfg).tolist() == [53, 51, 56]


def test_limit_with_a_and_b_and_the_position_table():
    src = torch.tensor([[5, 6, 7, 0], [5, 0, 0, 0]])
    assert max_output_lengths(src, CFG.replace(max_len=1000), a=1.5, b=2).tolist() == [6, 3]  # floor(1.5 * 3) + 2
    assert max_output_lengths(src, CFG.replace(max_len=1000), a=0.0, b=0).tolist() == [1, 1]  # at least one token
    assert max_output_lengths(src, CFG).tolist() == [40, 40]  # capped by max_len


@pytest.mark.parametrize("a,b", [(1.0, 10**20), (1.0, 2**63 - 1), (1e30, 0), (1e300, 2**63 - 1)])
def test_limits_of_any_size_are_the_position_table(a, b):
    """max_len_a and max_len_b far beyond the positions (10**20 from a config.yaml) are the
    table's limit: b = 10**20 was an OverflowError traceback, and 2**63 - 1 wrapped around
    int64 to a limit of one token (an empty translation)."""
    src = torch.tensor([[5, 6, 7, 0], [5, 0, 0, 0]])
    assert max_output_lengths(src, CFG, a=a, b=b).tolist() == [40, 40]


@pytest.mark.parametrize("length,alpha", [(1, 0.6), (4, 0.6), (10, 1.0), (7, 0.0)])
def test_length_penalty_is_gnmt(length, alpha):
    assert length_penalty(length, alpha) == pytest.approx(((5 + length) / 6) ** alpha)
    assert length_penalty(1, alpha) == pytest.approx(1.0)


def test_alpha_above_zero_favours_longer_outputs():
    """For the same per-token log-probability, a longer hypothesis scores relatively better
    with alpha > 0 than with alpha = 0."""
    short, long = (-2.0, 2), (-4.0, 4)
    ratio = lambda a: (long[0] / length_penalty(long[1], a)) - (short[0] / length_penalty(short[1], a))  # noqa: E731
    assert ratio(1.0) > ratio(0.0)


def test_next_token_logprobs_bans_pad_and_bos():
    logits = torch.tensor([[5.0, 4.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    lp = next_token_logprobs(logits.half(), CFG)
    assert lp.dtype == torch.float32
    assert lp[0, 0] == -math.inf and lp[0, 1] == -math.inf
    torch.testing.assert_close(lp[0, 2:], torch.log_softmax(logits, -1)[0, 2:], atol=1e-3, rtol=0)


def test_force_eos_keeps_the_real_eos_logprob():
    lp = torch.log_softmax(torch.randn(3, 6), -1)
    orig = lp.clone()
    force_eos(lp, torch.tensor([True, False, True]), eos_id=2)
    assert torch.equal(lp[1], orig[1])
    for r in (0, 2):
        assert lp[r, 2] == orig[r, 2] and torch.isinf(lp[r, [0, 1, 3, 4, 5]]).all()


def test_pad_batch():
    out = pad_batch([[5, 6, 7], [], [8]], pad_id=0)
    assert out.tolist() == [[5, 6, 7], [0, 0, 0], [8, 0, 0]] and out.dtype == torch.long
    assert pad_batch([[], []], pad_id=0).shape == (2, 1)


def test_the_two_length_penalties_by_hand():
    """GNMT's ((5 + |Y|) / 6) ** alpha, and |Y| ** alpha (Hugging Face's, fairseq's)."""
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(7, 0.6, "gnmt") == length_penalty(7, 0.6)
    assert length_penalty(7, 0.6, "length") == pytest.approx(7 ** 0.6)
    assert length_penalty(7, 0.0, "length") == 1.0 == length_penalty(7, 0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_next_token_logprobs_equal_the_float_copys_bit_for_bit(dtype):
    """Read straight into float32 (log_softmax's dtype=), the log-probabilities are those of
    the logits copied to float32 first, exactly, at a large vocabulary too."""
    torch.manual_seed(0)
    for rows, vocab, scale in [(3, 11, 1.0), (8, 58101, 10.0), (2, 4000, 100.0)]:
        logits = (torch.randn(rows, vocab) * scale).to(dtype)
        cfg = dataclasses.replace(CFG, vocab_size=vocab)
        expected = torch.log_softmax(logits.float(), dim=-1)
        expected[:, cfg.pad_id] = float("-inf")
        if cfg.bos_id != cfg.eos_id:
            expected[:, cfg.bos_id] = float("-inf")
        assert torch.equal(next_token_logprobs(logits, cfg), expected)


def test_length_batches_by_hand():
    """Shortest first, equal lengths in input order; a batch grows while rows x its longest
    fits the budget; an input over the budget is a batch of its own."""
    lengths = [5, 2, 9, 2, 4, 30, 4]
    assert length_batches(lengths, 12) == [[1, 3, 4], [6, 0], [2], [5]]  # 3 x 4 = 12; 2 x 5; 9; 30 alone
    assert length_batches(lengths, 1000) == [[1, 3, 4, 6, 0, 2, 5]]
    assert length_batches([], 12) == []
