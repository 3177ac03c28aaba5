"""attention() and MultiHeadAttention: the formula, both code paths, masks, torch parity."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from transformer.model import masks
from transformer.model.attention import MultiHeadAttention, attention

B, H, TQ, TK, D = 3, 2, 5, 6, 4


def qkv(dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, TQ, D), (B, H, TK, D), (B, H, TK, D)]
    return [torch.randn(s, generator=g).to(dtype).requires_grad_(requires_grad) for s in shapes]


def padding(lengths, t_k=TK):
    return (torch.arange(t_k)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]  # (B, 1, 1, T_k)


MASKS = {
    "none": None,
    "padding": padding([6, 3, 1]),
    "causal": masks.causal_mask(TQ, TK),  # the queries are the last TQ of TK positions
    "padding+causal": masks.combine(padding([6, 4, 2]), masks.causal_mask(TQ, TK)),
    "per-head": torch.rand(B, H, TQ, TK, generator=torch.Generator().manual_seed(3)) > 0.4,
}


def reference(q, k, v, mask):
    """softmax(Q K^T / sqrt(d_k)) V written out independently, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.exp(scores - scores.amax(-1, keepdim=True).clamp(min=-1e30))
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-300)  # fully masked rows: 0 / tiny = 0
    w = torch.nan_to_num(w)
    return torch.einsum("bhqk,bhkd->bhqd", w, v), w


@pytest.mark.parametrize("name", list(MASKS))
def test_both_paths_match_the_formula_and_each_other(name):
    mask = MASKS[name]
    q, k, v = qkv()
    fused, none = attention(q, k, v, mask, need_weights=False)
    explicit, w = attention(q, k, v, mask, need_weights=True)
    ref_out, ref_w = reference(q, k, v, mask)
    assert none is None and w.shape == (B, H, TQ, TK)
    assert (fused - explicit).abs().max().item() < 1e-6
    torch.testing.assert_close(explicit.double(), ref_out, rtol=0, atol=1e-6)
    torch.testing.assert_close(w.double(), ref_w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(MASKS))
def test_weights_are_a_distribution_over_allowed_keys(name):
    mask = MASKS[name]
    _, w = attention(*qkv(), mask, need_weights=True)
    rows = w.sum(-1)
    if mask is None:
        torch.testing.assert_close(rows, torch.ones_like(rows))
        return
    allowed = mask.expand_as(w)
    assert (w[~allowed] == 0).all()
    has_key = allowed.any(-1)
    torch.testing.assert_close(rows[has_key], torch.ones_like(rows[has_key]))
    assert (rows[~has_key] == 0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_masked_keys_do_not_influence_the_output(need_weights):
    mask = padding([6, 3, 1])
    q, k, v = qkv()
    out, _ = attention(q, k, v, mask, need_weights=need_weights)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 3:] = 1e4  # huge values at padded positions
    v2[1, :, 3:] = -1e4
    k2[2, :, 1:] = torch.randn_like(k2[2, :, 1:])
    out2, _ = attention(q, k2, v2, mask, need_weights=need_weights)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_fully_masked_row_is_finite_and_zero_forward_and_backward(dtype, need_weights):
    q, k, v = qkv(dtype, requires_grad=True)
    mask = torch.ones(B, 1, TQ, TK, dtype=torch.bool)
    mask[0, :, 2] = False  # query 2 of sentence 0 may attend nowhere
    mask[1] = False  # sentence 1: nothing at all (an all-padding source)
    out, w = attention(q, k, v, mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] == 0).all() and (out[1] == 0).all()
    assert out[0, :, 1].abs().sum() > 0  # the other rows are untouched
    if need_weights:
        assert (w[0, :, 2] == 0).all() and torch.isfinite(w).all()
    (out.float() ** 2).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[1] == 0).all() and (q.grad[0, :, 2] == 0).all()


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_gradcheck_attention(need_weights):
    """Analytic gradients match finite differences in float64, with a fully masked row."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = masks.combine(padding([4, 2], 4), masks.causal_mask(3, 4)).clone()
    mask[1, :, 0] = False
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, mask, need_weights=need_weights)[0],
                                    (q, k, v), eps=1e-6, atol=1e-6)


def test_dropout_on_weights_only_when_asked():
    q, k, v = qkv()
    torch.manual_seed(0)
    out, w = attention(q, k, v, None, dropout_p=0.5, need_weights=True)
    ref, _ = attention(q, k, v, None, need_weights=True)
    assert not torch.allclose(out, ref)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, TQ))  # the returned weights are pre-dropout


# ---- MultiHeadAttention against torch.nn.MultiheadAttention ----------------------------------

C, HEADS = 16, 4


def paired_modules(seed=0):
    torch.manual_seed(seed)
    ours = MultiHeadAttention(C, HEADS).eval()
    theirs = nn.MultiheadAttention(C, HEADS, batch_first=True).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
        w_q, w_k, w_v = theirs.in_proj_weight.chunk(3)
        b_q, b_k, b_v = theirs.in_proj_bias.chunk(3)
        for lin, w, b in ((ours.q_proj, w_q, b_q), (ours.k_proj, w_k, b_k), (ours.v_proj, w_v, b_v),
                          (ours.out_proj, theirs.out_proj.weight, theirs.out_proj.bias)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
    return ours, theirs


@pytest.mark.parametrize("kind", ["self+padding+causal", "cross+padding"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_matches_torch(kind, need_weights):
    ours, theirs = paired_modules()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, C, generator=g)
    if kind.startswith("self"):
        mem, pad = x, padding([5, 4, 2], 5)  # padded queries still see >= 1 key through the causal mask
        causal = masks.causal_mask(5)
        ours_mask = masks.combine(pad, causal)
        kwargs = dict(attn_mask=~causal[0, 0])  # torch: True = blocked
    else:
        mem, pad = torch.randn(3, 7, C, generator=g), padding([7, 3, 1], 7)
        ours_mask, kwargs = pad, {}
    out, w = ours(x, *ours.project_together(mem, (ours.k_proj, ours.v_proj)), ours_mask, need_weights=need_weights)
    ref, ref_w = theirs(x, mem, mem, key_padding_mask=masks.to_key_padding_mask(pad),
                        need_weights=True, average_attn_weights=False, **kwargs)
    assert out.shape == (3, 5, C)
    assert (out - ref).abs().max().item() < 1e-5
    if need_weights:
        assert w.shape == (3, HEADS, 5, mem.size(1))
        assert (w - ref_w).abs().max().item() < 1e-6


def test_fused_projections_equal_the_separate_layers():
    """project_qkv / project_together run one matmul over the side-by-side weights; the result and
    the gradient of every weight equal those of q_proj, k_proj, v_proj applied one by one."""
    mha, _ = paired_modules()
    x = torch.randn(3, 5, C, generator=torch.Generator().manual_seed(2))
    fused = mha.project_qkv(x)
    separate = [mha.split_heads(lin(x)) for lin in (mha.q_proj, mha.k_proj, mha.v_proj)]
    for a, b in zip(fused, separate):
        assert a.shape == (3, HEADS, 5, C // HEADS)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(mha.project_together(x, (mha.k_proj, mha.v_proj)), separate[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    upstream = [torch.randn(t.shape, generator=torch.Generator().manual_seed(i)) for i, t in enumerate(fused)]
    grads = []
    for outs in (fused, separate):
        params = [p for lin in (mha.q_proj, mha.k_proj, mha.v_proj) for p in (lin.weight, lin.bias)]
        grads.append(torch.autograd.grad(sum((o * u).sum() for o, u in zip(outs, upstream)), params))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_fused_projections_of_int8_quantised_layers():
    """int8 layers (decode/precision.py) hold no weight tensor to stack: an int8 copy's
    attention (Int8Attention) runs one matmul per layer, equal to the int8 layers applied one
    by one, and close to the float ones (int8 weights, ~1% error)."""
    import copy

    from transformer.decode.int8 import Int8Attention, Int8Linear

    mha, _ = paired_modules()
    qmha = copy.deepcopy(mha)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        setattr(qmha, name, Int8Linear.from_linear(getattr(mha, name)))
    qmha.__class__ = Int8Attention
    assert not isinstance(qmha.q_proj.weight, torch.Tensor)  # a method on int8 layers
    x = torch.randn(3, 5, C, generator=torch.Generator().manual_seed(2))
    separate = [qmha.split_heads(lin(x)) for lin in (qmha.q_proj, qmha.k_proj, qmha.v_proj)]
    for a, b, f in zip(qmha.project_qkv(x), separate, mha.project_qkv(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert 0 < (a.float() - f).abs().max().item() < 0.05 * f.abs().max().item()


def test_heads_are_independent_slices_of_the_projection():
    """Zeroing head 1's slice of W^O changes nothing that head 0 contributes, and the
    output equals the sum of per-head contributions (Concat(head_i) W^O)."""
    mha, _ = paired_modules()
    x = torch.randn(2, 3, C)
    k, v = mha.project_together(x, (mha.k_proj, mha.v_proj))
    q = mha.split_heads(mha.q_proj(x))
    heads, _ = attention(q, k, v)  # (B, H, T, D)
    d = C // HEADS
    w_o = mha.out_proj.weight  # (C, C): input columns grouped by head
    per_head = sum(heads[:, i] @ w_o[:, i * d:(i + 1) * d].T for i in range(HEADS))
    out, _ = mha(x, k, v)
    torch.testing.assert_close(out, per_head + mha.out_proj.bias, rtol=0, atol=1e-5)


def test_dropout_rate_scale_and_reproducibility():
    from transformer.model.dropout import Dropout

    d = Dropout(0.1).train()
    x = torch.ones(400, 500)
    torch.manual_seed(3)
    y = d(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.005  # 200k draws: the standard error is 0.0007
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.9))
    assert abs(y.mean().item() - 1.0) < 0.01  # inverted dropout keeps the expectation
    torch.manual_seed(3)
    assert torch.equal(d(x), y)  # the global generator drives it
    assert torch.equal(d.eval()(x), x)
    with pytest.raises(ValueError, match="dropout"):
        Dropout(1.0)


# ---- masks.CAUSAL: only the future hidden, no mask tensor for the fused kernel --------------

def causal_qkv(dtype, t=7):
    g = torch.Generator().manual_seed(5)
    return [torch.randn(B, H, t, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def out_and_grads(q, k, v, mask, need_weights):
    out, _ = attention(q, k, v, mask, need_weights=need_weights)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    return [out.detach().float(), *(g.float() for g in grads)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused-if-it-pays", "explicit"])
def test_causal_without_a_tensor_equals_the_causal_mask_forward_and_backward(dtype, need_weights):
    """CAUSAL gives what the explicit causal mask gives, on either path, and the fp32 result
    matches the float64 formula."""
    q, k, v = causal_qkv(dtype)
    mask = masks.causal_mask(7, 7)
    got = out_and_grads(q, k, v, masks.CAUSAL, need_weights)
    want = out_and_grads(q, k, v, mask, need_weights)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    if dtype == torch.float32:
        ref, _ = reference(q.detach(), k.detach(), v.detach(), mask)
        torch.testing.assert_close(got[0].double(), ref, rtol=0, atol=1e-6)


def test_causal_masks_as_many_queries_as_keys_only():
    with pytest.raises(ValueError, match="as many queries as keys"):
        masks.CAUSAL.tensor(3, 5)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every call of F.scaled_dot_product_attention: whether it was given a mask tensor and is_causal."""
    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append({"mask": attn_mask is not None, "is_causal": is_causal, "device": q.device.type})
        if q.device.type == "meta":
            return torch.empty_like(q)
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_off_the_cpu_every_call_without_weights_is_the_fused_kernel(sdpa_calls, dtype):
    """The policy for a GPU, seen on the meta device (any device but the CPU): the fused kernel
    in every dtype, is_causal for CAUSAL, the mask tensor otherwise."""
    q, k, v = (torch.empty(B, H, 7, D, dtype=dtype, device="meta") for _ in range(3))
    attention(q, k, v, masks.CAUSAL)
    attention(q, k, v, padding([7, 3, 1], 7))
    assert sdpa_calls == [{"mask": False, "is_causal": True, "device": "meta"},
                          {"mask": True, "is_causal": False, "device": "meta"}]


def test_a_compiled_graph_takes_causal_as_the_eager_attention_does(sdpa_calls):
    """Training's graph form (kernels.attention.graph_attention): off the CPU the fused kernel with
    is_causal for CAUSAL; on the CPU the matmul-softmax-matmul with the causal mask built."""
    from transformer.kernels.attention import graph_attention

    q, k, v = (torch.empty(B, H, 7, D, device="meta") for _ in range(3))
    graph_attention(q, k, v, masks.CAUSAL)
    graph_attention(q, k, v, padding([7, 3, 1], 7))
    assert sdpa_calls == [{"mask": False, "is_causal": True, "device": "meta"},
                          {"mask": True, "is_causal": False, "device": "meta"}]
    q, k, v = (torch.randn(B, H, 7, D) for _ in range(3))
    torch.testing.assert_close(graph_attention(q, k, v, masks.CAUSAL),
                               graph_attention(q, k, v, masks.causal_mask(7, 7)))
