"""train_step: gradient accumulation equals one big batch; non-finite losses skip the update."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from transformer.train import label_smoothed_nll_loss
from transformer.train.update import paper_adam, train_step

PAD, BOS, EOS = 0, 1, 2


def make_batch(sentences: list[tuple[list[int], list[int]]], width_src: int | None = None,
               width_tgt: int | None = None) -> SimpleNamespace:
    """(source ids, target ids) pairs -> src, tgt_in (BOS + y), tgt_out (y + EOS), padded."""
    ws = width_src or max(len(s) for s, _ in sentences)
    wt = width_tgt or max(len(t) for _, t in sentences) + 1
    src = torch.full((len(sentences), ws), PAD)
    tgt_in = torch.full((len(sentences), wt), PAD)
    tgt_out = torch.full((len(sentences), wt), PAD)
    for i, (s, t) in enumerate(sentences):
        src[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS] + t)
        tgt_out[i, : len(t) + 1] = torch.tensor(t + [EOS])
    return SimpleNamespace(src=src, tgt_in=tgt_in, tgt_out=tgt_out, inputs=(src, tgt_in),
                           n_tgt_tokens=int((tgt_out != PAD).sum()))


FIRST = [([3, 4, 5, 6], [7, 8]), ([9, 3], [4, 5, 6, 7, 8])]
SECOND = [([5, 5, 5, 5, 5, 5], [3]), ([4, 6, 8], [9, 10, 11]), ([12], [3, 4]), ([7, 7], [5])]
# 9 and 11 target tokens: averaging per-micro-batch means would give a different gradient


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("overrides", [{}, dict(norm_first=True, tie_embeddings=False)], ids=["tied", "untied-prenorm"])
def test_accumulating_two_micro_batches_equals_one_batch(make_model, overrides):
    one = make_model(**overrides).train()
    two = make_model(**overrides).train()
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), two.parameters()))
    big = make_batch(FIRST + SECOND)
    parts = [make_batch(FIRST), make_batch(SECOND)]
    assert [p.n_tgt_tokens for p in parts] == [9, 11] and big.n_tgt_tokens == 20
    s1 = train_step(one, [big], torch.optim.SGD(one.parameters()), lr=0.5, epsilon=0.1).read()
    s2 = train_step(two, parts, torch.optim.SGD(two.parameters()), lr=0.5, epsilon=0.1).read()
    g1, g2 = grads(one), grads(two)
    assert g1.keys() == g2.keys() and len(g1) == len(list(one.parameters()))
    worst_grad = max((g1[n] - g2[n]).abs().max().item() for n in g1)
    assert worst_grad < 1e-6
    worst_weight = max((a - b).abs().max().item() for a, b in zip(one.parameters(), two.parameters()))
    assert worst_weight < 1e-6
    assert (s1.n_tokens, s1.skipped) == (s2.n_tokens, s2.skipped) == (20, False)
    assert s1.loss == pytest.approx(s2.loss, rel=1e-6) and s1.nll == pytest.approx(s2.nll, rel=1e-6)
    assert s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-5)


def test_step_reports_per_token_loss_and_updates_with_the_given_lr(make_model):
    model = make_model().train()
    batch = make_batch(FIRST)
    with torch.no_grad():
        loss_sum, nll_sum, n = label_smoothed_nll_loss(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=123.0)
    stats = train_step(model, [batch], opt, lr=0.25, epsilon=0.1).read()
    assert opt.param_groups[0]["lr"] == 0.25 and stats.lr == 0.25
    assert stats.n_tokens == int(n) == 9
    assert stats.loss == pytest.approx(float(loss_sum) / 9, rel=1e-6)
    assert stats.nll == pytest.approx(float(nll_sum) / 9, rel=1e-6)
    for p, b in zip(model.parameters(), before):  # SGD: w <- w - lr * g
        torch.testing.assert_close(p.detach(), b - 0.25 * p.grad, rtol=0, atol=1e-7)
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in model.parameters()))
    assert stats.grad_norm == pytest.approx(norm, rel=1e-5)


def test_clipping_bounds_the_update_and_reports_the_norm_before_clipping(make_model):
    model = make_model().train()
    before = [p.detach().clone() for p in model.parameters()]
    stats = train_step(model, [make_batch(FIRST)], torch.optim.SGD(model.parameters()), lr=1.0, clip_norm=1e-3).read()
    assert stats.grad_norm > 1e-3
    step = math.sqrt(sum(float(((p.detach() - b) ** 2).sum()) for p, b in zip(model.parameters(), before)))
    assert step == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-on-device", "read-on-host"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_skips_the_update(make_model, bad, fused):
    """Fused Adam skips on the device (the found_inf flag); another optimizer reads the verdict.
    Either way the weights and Adam's moments and step count are left as they were: the next,
    healthy update gives exactly the weights a fresh optimizer's first update gives."""
    model, fresh = make_model().train(), make_model().train()
    opt, fresh_opt = (torch.optim.Adam(m.parameters(), lr=1e-3, fused=fused) for m in (model, fresh))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def poisoned(*args):
        return model(*args) * torch.tensor(bad)  # every logit non-finite: a blown-up forward pass

    stats = train_step(model, [make_batch(FIRST), make_batch(SECOND)], opt, lr=1e-3, forward=poisoned).read()
    assert stats.skipped
    assert not math.isfinite(stats.loss)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    for state in opt.state.values():  # fused: made, and left at zero; otherwise not made
        assert float(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    stats = train_step(model, [make_batch(FIRST)], opt, lr=1e-3).read()
    assert not stats.skipped and math.isfinite(stats.loss)
    train_step(fresh, [make_batch(FIRST)], fresh_opt, lr=1e-3)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    for (n, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p.detach(), q.detach()), n


def test_non_finite_gradient_alone_also_skips(make_model):
    model = make_model().train()
    before = [p.detach().clone() for p in model.parameters()]
    w = model.decoder.layers[0].ffn.fc1.weight
    hook = w.register_hook(lambda g: g * float("nan"))
    stats = train_step(model, [make_batch(FIRST)], torch.optim.SGD(model.parameters()), lr=0.1).read()
    hook.remove()
    assert stats.skipped and math.isfinite(stats.loss)
    assert all(torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))


def test_bf16_autocast_step_matches_fp32_roughly(make_model):
    fp32, bf16 = make_model().train(), make_model().train()
    batch = make_batch(FIRST + SECOND)
    s32 = train_step(fp32, [batch], torch.optim.SGD(fp32.parameters()), lr=0.1).read()
    s16 = train_step(bf16, [batch], torch.optim.SGD(bf16.parameters()), lr=0.1, amp_dtype=torch.bfloat16).read()
    assert not s16.skipped and math.isfinite(s16.loss)
    assert s16.loss == pytest.approx(s32.loss, rel=3e-2)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in bf16.parameters())


def test_paper_adam_holds_each_parameter_once_with_the_papers_settings(make_model):
    model = make_model()
    opt = paper_adam(model.parameters())
    (group,) = opt.param_groups
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    assert len(group["params"]) == len(list(model.parameters()))
    assert sum(p is model.src_embed.weight for p in group["params"]) == 1
    stats = train_step(model.train(), [make_batch(FIRST)], opt, lr=1e-3).read()
    assert not stats.skipped and group["lr"] == 1e-3


def test_fp16_step_on_the_cpu_with_a_grad_scaler_matches_fp32_roughly(make_model):
    """What a CPU run with precision fp16 does: the loss is scaled for the backward pass and
    the gradients the optimizer sees are unscaled again."""
    fp32, fp16 = make_model().train(), make_model().train()
    batch = make_batch(FIRST + SECOND)
    s32 = train_step(fp32, [batch], torch.optim.SGD(fp32.parameters()), lr=0.0).read()
    scaler = torch.amp.GradScaler("cpu")
    s16 = train_step(fp16, [batch], torch.optim.SGD(fp16.parameters()), lr=0.0, amp_dtype=torch.float16,
                     grad_scaler=scaler).read()
    assert not s16.skipped and scaler.get_scale() == 65536.0
    assert s16.loss == pytest.approx(s32.loss, rel=1e-2)
    assert s16.grad_norm == pytest.approx(s32.grad_norm, rel=5e-2)  # unscaled: not 65536 times larger
    g32, g16 = grads(fp32), grads(fp16)
    assert g16.keys() == g32.keys()
    flat32, flat16 = (torch.cat([g[k].flatten() for k in sorted(g)]) for g in (g32, g16))
    assert (flat16 - flat32).norm() <= 0.1 * flat32.norm()


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_optimizers_are_torchs_fused_ones_which_skip_on_the_device(make_model, name):
    """torch 2.13 has fused Adam and AdamW on the CPU and on CUDA: one kernel for all parameters,
    which takes a found_inf flag, so that train_step's skip needs no read on the host."""
    from transformer.train.update import make_optimizer

    opt = make_optimizer(make_model(), name, 0.01, [0.9, 0.98])
    assert all(group["fused"] for group in opt.param_groups)
    assert opt._step_supports_amp_scaling  # noqa: SLF001 (what GradScaler, and step_unless, look for)
