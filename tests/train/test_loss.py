"""label_smoothed_nll_loss against hand computation."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.train import label_smoothed_nll_loss
from transformer.train.loss import fused_label_smoothed_nll_loss

# B=2, T=3, V=4; pad id 0. Row 0 has two real targets, row 1 one, the rest is padding.
LOGITS = torch.tensor([
    [[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 3.0, 1.0], [9.0, -9.0, 0.0, 0.0]],
    [[2.0, -1.0, 0.0, 1.0], [5.0, 5.0, 5.0, 5.0], [0.0, 1.0, 2.0, 3.0]],
])
TARGET = torch.tensor([[1, 2, 0], [3, 0, 0]])


def log_softmax(row):
    m = max(row)
    z = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - z for x in row]


def hand_loss(eps):
    """Sum over the three real tokens of (1 - eps) * nll + eps * mean_v(-log p(v))."""
    loss = nll = 0.0
    for b, t in [(0, 0), (0, 1), (1, 0)]:
        lp = log_softmax(LOGITS[b, t].tolist())
        y = int(TARGET[b, t])
        nll += -lp[y]
        loss += (1 - eps) * -lp[y] + eps * -sum(lp) / 4
    return loss, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_hand_computation_with_padding(eps):
    loss, nll, n = label_smoothed_nll_loss(LOGITS, TARGET, epsilon=eps, pad_id=0)
    exp_loss, exp_nll = hand_loss(eps)
    assert int(n) == 3
    assert float(loss) == pytest.approx(exp_loss, rel=1e-6)
    assert float(nll) == pytest.approx(exp_nll, rel=1e-6)
    # the per-token mean is over the 3 real tokens, not the 6 positions
    assert float(loss) / int(n) == pytest.approx(exp_loss / 3, rel=1e-6)


def test_padding_positions_contribute_nothing():
    """Whatever the logits at padded positions, the loss and its gradient ignore them."""
    logits = LOGITS.clone()
    logits[0, 2] = torch.tensor([1e4, -1e4, 0.0, 50.0])
    logits[1, 1:] = torch.randn(2, 4) * 100
    logits.requires_grad_(True)
    loss, nll, n = label_smoothed_nll_loss(logits, TARGET, epsilon=0.1)
    assert float(loss.detach()) == pytest.approx(hand_loss(0.1)[0], rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[0, 2] == 0).all() and (logits.grad[1, 1:] == 0).all()
    assert (logits.grad[0, :2] != 0).all()


def test_non_finite_logits_at_padding_do_not_make_the_loss_inf():
    logits = LOGITS.clone()
    logits[0, 2] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    logits[1, 1:] = -float("inf")
    loss, nll, n = label_smoothed_nll_loss(logits, TARGET, epsilon=0.1)
    assert float(loss) == pytest.approx(hand_loss(0.1)[0], rel=1e-6)
    assert float(nll) == pytest.approx(hand_loss(0.1)[1], rel=1e-6)


def test_all_padding_is_zero_not_inf_or_nan():
    loss, nll, n = label_smoothed_nll_loss(LOGITS, torch.zeros(2, 3, dtype=torch.long), epsilon=0.1)
    assert (float(loss), float(nll), int(n)) == (0.0, 0.0, 0)


def test_eps_zero_is_cross_entropy_with_ignore_index():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, 11, generator=g)
    target = torch.randint(1, 11, (4, 7), generator=g)
    target[1, 4:] = 0
    target[3, 1:] = 0
    loss, nll, n = label_smoothed_nll_loss(logits, target, epsilon=0.0, pad_id=0)
    ce = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0)
    assert float(loss) / int(n) == pytest.approx(float(ce), rel=1e-6)
    assert float(nll) == pytest.approx(float(loss), rel=1e-6)
    # F.cross_entropy's own label smoothing spreads eps over the whole vocabulary too
    loss, _, n = label_smoothed_nll_loss(logits, target, epsilon=0.1, pad_id=0)
    ce = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=0.1)
    assert float(loss) / int(n) == pytest.approx(float(ce), rel=1e-5)


def test_flat_inputs_and_other_pad_id():
    loss3, nll3, n3 = label_smoothed_nll_loss(LOGITS, TARGET, 0.1, pad_id=0)
    loss2, nll2, n2 = label_smoothed_nll_loss(LOGITS.view(6, 4), TARGET.view(6), 0.1, pad_id=0)
    assert float(loss3) == pytest.approx(float(loss2)) and int(n3) == int(n2)
    shifted = torch.where(TARGET == 0, 3, torch.where(TARGET == 3, 0, TARGET))  # pad id 3 instead of 0
    _, _, n = label_smoothed_nll_loss(LOGITS, shifted, 0.1, pad_id=3)
    assert int(n) == 3


def test_half_precision_logits_are_computed_in_float32():
    loss, _, _ = label_smoothed_nll_loss(LOGITS.bfloat16(), TARGET, 0.1)
    assert loss.dtype == torch.float32
    assert float(loss) == pytest.approx(hand_loss(0.1)[0], rel=1e-2)


# ---- the fused (hand-written backward) version used by train_step ----------------------------

@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_fused_loss_matches_the_reference_forward_and_backward(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 9, generator=g, dtype=torch.float64)
    target = torch.randint(1, 9, (3, 5), generator=g)
    target[0, 3:] = 0
    target[2, 1:] = 0
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    ref = label_smoothed_nll_loss(a, target, eps)
    fused = fused_label_smoothed_nll_loss(b, target, eps)
    assert int(ref[2]) == int(fused[2]) == 9
    torch.testing.assert_close(fused[0].double(), ref[0].double(), rtol=1e-6, atol=0)
    torch.testing.assert_close(fused[1].double(), ref[1].double(), rtol=1e-6, atol=0)
    # gradients through both outputs at once (the nll term with its own upstream weight)
    (ref[0] + 0.3 * ref[1]).backward()
    (fused[0] + 0.3 * fused[1]).backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)  # the reference computes in fp32
    assert (b.grad[0, 3:] == 0).all() and (b.grad[2, 1:] == 0).all()


def test_fused_loss_gradcheck():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1, 4, 0, 2, 0, 3])
    assert torch.autograd.gradcheck(lambda x: fused_label_smoothed_nll_loss(x, target, 0.2)[:2], (logits,))


def test_fused_loss_hand_example_all_padding_and_bf16():
    loss, nll, n = fused_label_smoothed_nll_loss(LOGITS, TARGET, epsilon=0.1)
    assert (float(loss), float(nll), int(n)) == (pytest.approx(hand_loss(0.1)[0], rel=1e-6),
                                                 pytest.approx(hand_loss(0.1)[1], rel=1e-6), 3)
    loss, nll, n = fused_label_smoothed_nll_loss(LOGITS, torch.zeros(2, 3, dtype=torch.long), epsilon=0.1)
    assert (float(loss), float(nll), int(n)) == (0.0, 0.0, 0)
    x = LOGITS.bfloat16().requires_grad_(True)
    loss, _, _ = fused_label_smoothed_nll_loss(x, TARGET, 0.1)
    assert loss.dtype == torch.float32 and float(loss.detach()) == pytest.approx(hand_loss(0.1)[0], rel=1e-2)
    loss.backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad).all()


def test_fused_loss_ignores_non_finite_logits_at_padding_in_the_gradient_too():
    logits = LOGITS.clone()
    logits[0, 2] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    logits[1, 1:] = -float("inf")
    logits.requires_grad_(True)
    loss, _, _ = fused_label_smoothed_nll_loss(logits, TARGET, 0.1)
    assert float(loss.detach()) == pytest.approx(hand_loss(0.1)[0], rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all()


def test_fused_loss_in_several_row_blocks_matches_the_reference(monkeypatch):
    """The fused loss works through the rows in blocks; force 3 rows a block over 10 rows
    (a ragged last block) and compare forward and gradient with the reference."""
    import transformer.train.loss as loss_module

    monkeypatch.setattr(loss_module, "_CHUNK_ELEMENTS", 3 * 7)
    assert [c for c in loss_module._row_chunks(10, 7)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(10, 7, generator=g, dtype=torch.float64)
    target = torch.randint(1, 7, (10,), generator=g)
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    ref, fused = label_smoothed_nll_loss(a, target, 0.1), fused_label_smoothed_nll_loss(b, target, 0.1)
    torch.testing.assert_close(fused[0].double(), ref[0].double(), rtol=1e-6, atol=0)  # the reference is fp32
    ref[0].backward()
    fused[0].backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def kernels():
    """The compiled loss kernels (torch.compile), built and checked once for these tests."""
    from transformer.train.loss import compile_loss

    built = compile_loss(dtype=torch.float32)
    assert built is not None, "torch.compile should work on this machine"
    return built


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_loss_matches_the_eager_blocks(kernels, dtype):
    """compile_loss(): the same loss and gradient as the eager blocks, on a shape the check
    inside compile_loss did not use (symbolic shapes), with padding rows dropped first."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(4, 9, 611, generator=g) * 3).to(dtype)
    target = torch.randint(1, 611, (4, 9), generator=g)
    target[1, 4:] = 0
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    got = fused_label_smoothed_nll_loss(a, target, 0.1, kernels=kernels)
    (got[0] + 0.3 * got[1]).backward()
    ref = fused_label_smoothed_nll_loss(b, target, 0.1)
    (ref[0] + 0.3 * ref[1]).backward()
    assert int(got[2]) == int(ref[2]) == 31
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-3}
    torch.testing.assert_close(got[0], ref[0], **tol)
    torch.testing.assert_close(got[1], ref[1], **tol)
    torch.testing.assert_close(a.grad, b.grad, **tol)
    assert a.grad.dtype == dtype and (a.grad[1, 4:] == 0).all()


def test_compiled_loss_leaves_float64_to_the_eager_code(kernels):
    """float64 logits (gradcheck's) do not go through the float32 kernels."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1, 4, 0, 2, 0, 3])
    assert not kernels.applies_to(logits)
    assert torch.autograd.gradcheck(lambda x: fused_label_smoothed_nll_loss(x, target, 0.2, kernels=kernels)[:2],
                                    (logits,))


def test_compile_loss_falls_back_to_eager_with_a_warning(monkeypatch):
    from transformer.train.loss import compile_loss

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nlong details")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(UserWarning, match=r"compile_loss: .*RuntimeError: no C\+\+ compiler found\); the loss stays eager"):
        assert compile_loss() is None


def test_a_graph_break_in_the_loss_is_not_compiled_in_pieces(monkeypatch):
    """compile_loss compiles each pass as one graph (fullgraph=True): a pass that breaks the
    graph is an error, so the loss stays eager with a warning instead of running as pieces."""
    from transformer.train import loss

    def breaking_forward(logits, target):
        torch._dynamo.graph_break()
        return loss._reference_forward_pass(logits, target)

    monkeypatch.setattr(loss, "_reference_forward_pass", loss._forward_pass, raising=False)
    monkeypatch.setattr(loss, "_forward_pass", breaking_forward)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=r"compile_loss: the compiled loss is not usable here .*the loss stays eager"):
        assert loss.compile_loss(dtype=torch.float32) is None
    torch._dynamo.reset()
