"""Learning-rate schedules at known steps (section 5.3 of the paper)."""
from __future__ import annotations

import pytest

from transformer.train import cooldown_factor, dropout_ramp, inverse_sqrt_lr, linear_decay_lr, noam_lr, paper_adam_kwargs

D, W = 512, 4000


def test_noam_at_known_steps():
    assert noam_lr(1, D, W) == pytest.approx(D ** -0.5 * W ** -1.5)  # 1.747e-7
    assert noam_lr(1, D, W) == pytest.approx(1.7469e-7, rel=1e-4)
    assert noam_lr(W, D, W) == pytest.approx(D ** -0.5 * W ** -0.5)  # the peak, 6.988e-4
    assert noam_lr(W, D, W) == pytest.approx(6.9877e-4, rel=1e-4)
    assert noam_lr(2 * W, D, W) == pytest.approx(D ** -0.5 * (2 * W) ** -0.5)
    assert noam_lr(2 * W, D, W) == pytest.approx(noam_lr(W, D, W) / 2 ** 0.5)
    assert noam_lr(W // 2, D, W) == pytest.approx(noam_lr(W, D, W) / 2)  # linear warmup
    assert noam_lr(100, D, W, scale=2.0) == pytest.approx(2 * noam_lr(100, D, W))


def test_noam_step_zero_is_step_one():
    assert noam_lr(0, D, W) == noam_lr(1, D, W) > 0


def test_noam_peaks_at_warmup():
    lrs = [noam_lr(s, D, W) for s in range(1, 3 * W)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == W
    assert all(a < b for a, b in zip(lrs[: W - 1], lrs[1:W]))
    assert all(a > b for a, b in zip(lrs[W - 1:], lrs[W:]))


def test_inverse_sqrt():
    peak = 5e-4
    assert inverse_sqrt_lr(W, peak, W) == pytest.approx(peak)
    assert inverse_sqrt_lr(W // 4, peak, W) == pytest.approx(peak / 4)
    assert inverse_sqrt_lr(4 * W, peak, W) == pytest.approx(peak / 2)
    assert inverse_sqrt_lr(0, peak, W) == inverse_sqrt_lr(1, peak, W) == pytest.approx(peak / W)
    # noam is inverse_sqrt with peak d^-0.5 * warmup^-0.5
    for step in (1, 123, W, 9999):
        assert noam_lr(step, D, W) == pytest.approx(inverse_sqrt_lr(step, D ** -0.5 * W ** -0.5, W))


def test_linear_decay():
    peak, total = 1e-3, 1000
    assert linear_decay_lr(0, peak, 100, total) == linear_decay_lr(1, peak, 100, total) == pytest.approx(1e-5)
    assert linear_decay_lr(50, peak, 100, total) == pytest.approx(peak / 2)
    assert linear_decay_lr(100, peak, 100, total) == pytest.approx(peak)
    assert linear_decay_lr(550, peak, 100, total) == pytest.approx(peak / 2)
    assert linear_decay_lr(total, peak, 100, total) == 0.0
    assert linear_decay_lr(total + 10, peak, 100, total) == 0.0  # never negative
    assert linear_decay_lr(5, peak, 10, 10) == pytest.approx(peak / 2)  # total == warmup: no division by zero


def test_cooldown_factor():
    total, cool = 100, 4
    assert [cooldown_factor(s, total, cool) for s in (1, 50, 96, 97, 98, 99, 100)] == [1, 1, 1, 1, 0.75, 0.5, 0.25]
    assert cooldown_factor(101, total, cool) == cooldown_factor(500, total, cool) == 0.0  # never negative
    assert all(cooldown_factor(s, total, 0) == 1.0 for s in (1, 100, 101))  # 0 = no cooldown
    assert cooldown_factor(1, 10, 10) == 1.0 and cooldown_factor(10, 10, 10) == pytest.approx(0.1)
    lrs = [inverse_sqrt_lr(s, 1e-3, 8) * cooldown_factor(s, total, 20) for s in range(1, total + 1)]
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:]))  # strictly falling to the end
    assert lrs[-1] == pytest.approx(inverse_sqrt_lr(total, 1e-3, 8) / 20)


def test_dropout_ramp():
    assert [dropout_ramp(s, 0.1, 0.3, 4) for s in (1, 2, 3, 4, 5, 100)] == pytest.approx([0.15, 0.2, 0.25, 0.3, 0.3, 0.3])
    assert dropout_ramp(0, 0.1, 0.3, 4) == pytest.approx(0.15)  # step 0 is step 1
    assert all(dropout_ramp(s, 0.1, 0.3, 0) == 0.3 for s in (1, 7))  # 0 = no ramp: the model's dropout
    assert [dropout_ramp(s, 0.3, 0.1, 2) for s in (1, 2, 3)] == pytest.approx([0.2, 0.1, 0.1])  # falling works too


def test_paper_adam():
    assert paper_adam_kwargs() == {"betas": (0.9, 0.98), "eps": 1e-9}
