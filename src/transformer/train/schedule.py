"""The paper's learning-rate schedule (section 5.3), nanoGPT's cosine one and a dropout
ramp, as pure functions."""
from __future__ import annotations

import math


def noam_lr(step: int, d_model: int, warmup: int = 4000, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Rises linearly for ``warmup`` steps, then decays with the inverse square root of the
    step. ``step`` counts optimizer updates from 1; step 0 is treated as step 1 (never a
    division by zero, never a zero learning rate for the first update).
    """
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def inverse_sqrt_lr(step: int, peak_lr: float, warmup: int) -> float:
    """Linear warmup to ``peak_lr`` over ``warmup`` steps, then peak * sqrt(warmup / step)
    (the same shape as :func:`noam_lr`, parametrised by its peak as fairseq does)."""
    step = max(step, 1)
    return peak_lr * min(step / warmup, (warmup / step) ** 0.5)


def linear_decay_lr(step: int, peak_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``peak_lr``, then linear decay to zero at step ``total``."""
    step = max(step, 1)
    if step <= warmup:
        return peak_lr * step / warmup
    return peak_lr * max(0.0, (total - step) / max(total - warmup, 1))


def cosine_lr(step: int, peak_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """nanoGPT's ``get_lr``: linear warmup to ``peak_lr`` over ``warmup`` updates, then a
    cosine from ``peak_lr`` down to ``min_lr`` at update ``total``, and ``min_lr`` after it.

    ``step`` counts updates from 1; nanoGPT counts iterations from 0, so update ``step`` gets
    its ``get_lr(step - 1)``: ``peak_lr * step / (warmup + 1)`` while warming up.
    """
    it = max(step, 1) - 1
    if it < warmup:
        return peak_lr * (it + 1) / (warmup + 1)
    if it > total:
        return min_lr
    decay_ratio = (it - warmup) / max(total - warmup, 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (peak_lr - min_lr)


def cooldown_factor(step: int, total: int, cooldown: int) -> float:
    """Multiplier that decays the learning rate linearly to zero over the last ``cooldown``
    updates before update ``total`` (a warmup-stable-decay / "cooldown" tail on any schedule).

    1.0 up to update ``total - cooldown + 1``, then ``(total - step + 1) / cooldown``: the last
    update gets ``1 / cooldown`` of the base rate, and updates past ``total`` get zero.
    ``cooldown == 0`` means no cooldown (always 1.0).
    """
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, (total - step + 1) / cooldown))


def dropout_ramp(step: int, start: float, end: float, ramp: int) -> float:
    """The dropout probability for update ``step`` (from 1) when it rises (or falls) linearly
    from ``start`` to ``end`` over the first ``ramp`` updates, then stays at ``end``
    ("curriculum dropout": learn fast while the model under-fits, regularise once it could
    over-fit). ``ramp == 0`` means no ramp (always ``end``)."""
    if ramp <= 0:
        return end
    return start + (end - start) * min(1.0, max(step, 1) / ramp)


def lr_at(cfg, d_model: int, step: int) -> float:
    """The learning rate of update ``step`` (from 1) under a TrainConfig ``cfg``'s schedule
    (noam, cosine or inverse_sqrt) and cooldown, for a model of width ``d_model``."""
    if cfg.lr_schedule == "noam":
        base = noam_lr(step, d_model, cfg.warmup, cfg.lr_scale)
    elif cfg.lr_schedule == "cosine":
        base = cosine_lr(step, cfg.peak_lr, cfg.min_lr, cfg.warmup, cfg.lr_decay_steps or cfg.max_steps)
    else:
        base = inverse_sqrt_lr(step, cfg.peak_lr, cfg.warmup)
    return base * cooldown_factor(step, cfg.max_steps, cfg.cooldown)


def paper_adam_kwargs() -> dict:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (section 5.3)."""
    return {"betas": (0.9, 0.98), "eps": 1e-9}
