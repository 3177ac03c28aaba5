"""The full model: tying, causality, padding, cached == full decoding, weights, options, gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from transformer import ModelConfig, Transformer
from transformer.model.layers import FeedForward, SublayerConnection

BOS = 1


def with_bos(tgt: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.full((tgt.size(0), 1), BOS), tgt], dim=1)


# ---- tied and untied embeddings -----------------------------------------------------------

def test_tied_embeddings_are_one_tensor(make_model, rand_tokens):
    model = make_model()
    w = model.src_embed.weight
    assert model.tgt_embed.weight is w and model.out_proj is None
    # the output layer uses it too: logits = h E^T
    h = torch.randn(2, 3, 16)
    torch.testing.assert_close(model.project(h), h @ w.T, rtol=0, atol=0)
    params = list(model.parameters())
    assert sum(p is w for p in params) == 1
    assert len({id(p) for p in params}) == len(params)
    opt = torch.optim.Adam(model.parameters())
    held = [p for g in opt.param_groups for p in g["params"]]
    assert sum(p is w for p in held) == 1 and len(held) == len(params)
    # one gradient collects the source, target and output uses
    src, tgt = rand_tokens([4, 3]), with_bos(rand_tokens([2, 2]))
    model(src, tgt).sum().backward()
    assert w.grad is not None and w.grad[src[0, 0]].abs().sum() > 0


def test_untied_embeddings_are_separate(make_model):
    model = make_model(tie_embeddings=False, tgt_vocab_size=9)
    src_w, tgt_w, out_w = model.src_embed.weight, model.tgt_embed.weight, model.out_proj.weight
    assert src_w.shape == (13, 16) and tgt_w.shape == (9, 16) and out_w.shape == (9, 16)
    ids = {id(src_w), id(tgt_w), id(out_w)}
    assert len(ids) == 3
    assert sum(id(p) in ids for p in model.parameters()) == 3
    logits = model(torch.tensor([[12, 11, 3]]), torch.tensor([[1, 8]]))  # ids valid in each vocabulary
    assert logits.shape == (1, 2, 9)
    # an untied model with one vocabulary still keeps three matrices
    same = make_model(tie_embeddings=False)
    assert same.src_embed.weight is not same.tgt_embed.weight
    assert same.num_parameters() == make_model().num_parameters() + 2 * 13 * 16


# ---- causality and padding -----------------------------------------------------------------

def test_no_future_target_token_changes_earlier_logits(variant_model, rand_tokens):
    model = variant_model
    v = model.cfg.target_vocab_size
    src = rand_tokens([6, 4])
    tgt = with_bos(rand_tokens([6, 6], vocab=v))
    base = model(src, tgt)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = 3 + (tgt[:, t + 1:] - 2) % (v - 3)  # every later token replaced by another real one
        assert (changed[:, t + 1:] != tgt[:, t + 1:]).all()
        out = model(src, changed)
        assert (out[:, : t + 1] - base[:, : t + 1]).abs().max().item() < 1e-6, f"leak into position {t}"
        assert (out[:, t + 1] - base[:, t + 1]).abs().max().item() > 1e-4  # and the change is visible


def test_future_positions_get_no_gradient(make_model, rand_tokens):
    model = make_model()
    src, tgt = rand_tokens([5]), with_bos(rand_tokens([4]))
    x = model.positions(model.tgt_embed(tgt)).detach().requires_grad_(True)
    cache = model.start_cache(model.encode(src), src)
    h, _, _ = model.decoder(x, cache)
    h[0, 2].sum().backward()
    assert (x.grad[0, 3:] == 0).all() and (x.grad[0, :3].abs().sum(-1) > 0).all()


def test_extra_source_padding_never_changes_the_logits(variant_model, rand_tokens):
    model = variant_model
    src5 = rand_tokens([4], width=5)
    src12 = F.pad(src5, (0, 7), value=0)
    tgt = with_bos(rand_tokens([4], vocab=model.cfg.target_vocab_size))
    diff = (model(src5, tgt) - model(src12, tgt)).abs().max().item()
    assert diff < 1e-5
    # and in a batch beside a longer sentence
    batch = torch.cat([src12, rand_tokens([12])])
    both = model(batch, tgt.expand(2, -1))
    assert (both[0] - model(src5, tgt)[0]).abs().max().item() < 1e-5
    assert (both[1] - both[0]).abs().max().item() > 1e-3  # the other sentence is not ignored


def test_forward_with_select_returns_only_the_selected_positions(variant_model, rand_tokens):
    """Training projects to the vocabulary only where a real target token is."""
    model = variant_model
    src = rand_tokens([6, 3, 5])
    tgt = with_bos(rand_tokens([4, 2, 3], vocab=model.cfg.target_vocab_size))
    select = torch.zeros_like(tgt, dtype=torch.bool)
    select[0, :5], select[1, :3], select[2, :4] = True, True, True
    full = model(src, tgt)
    picked = model(src, tgt, select)
    assert picked.shape == (12, full.size(-1))
    assert (picked - full[select]).abs().max().item() < 1e-6  # row-major order: sentence 0 first


def test_extra_target_padding_never_changes_real_positions(make_model, rand_tokens):
    model = make_model()
    src, tgt = rand_tokens([5]), with_bos(rand_tokens([3]))
    padded = F.pad(tgt, (0, 4), value=0)
    assert (model(src, padded)[:, :4] - model(src, tgt)).abs().max().item() < 1e-5


def record_sdpa(monkeypatch) -> list[dict]:
    """Every call of F.scaled_dot_product_attention: whether it had a mask tensor, and is_causal."""
    calls, real = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append({"mask": attn_mask is not None, "is_causal": is_causal})
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def test_teacher_forcing_masks_only_the_future_and_right_padding_needs_no_mask(variant_model, rand_tokens,
                                                                                monkeypatch):
    """The decoder's self-attention in training is the fused kernel's is_causal, with no mask
    tensor, though the targets are right-padded: a real position never sees the padding after
    it, so each sentence's real positions get the logits it gets alone, unpadded."""
    model = variant_model
    src_lengths, tgt_lengths = [6, 3, 5], [4, 1, 3]
    src = rand_tokens(src_lengths)
    tgt = with_bos(rand_tokens(tgt_lengths, vocab=model.cfg.target_vocab_size))
    calls = record_sdpa(monkeypatch)
    batch = model(src, tgt)  # fp32 on a CPU: every attention through the fused kernel
    causal = [c for c in calls if c["is_causal"]]
    assert len(causal) == model.cfg.n_layers and not any(c["mask"] for c in causal)
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        alone = model(src[i:i + 1, :s], tgt[i:i + 1, :t + 1])
        torch.testing.assert_close(batch[i:i + 1, :t + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_all_padding_source_is_finite_forward_and_backward(make_model, rand_tokens, dtype, norm_first):
    """An empty source line (all padding) in a batch: every attention row over it is fully
    masked. Nothing may become NaN, in the output or in any gradient."""
    model = make_model(dtype=dtype, norm_first=norm_first).train()
    src = rand_tokens([5, 0])  # sentence 1 is all padding
    tgt = with_bos(rand_tokens([3, 3]))
    logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    logits.float().logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


# ---- cached incremental decoding == the full forward ----------------------------------------

def decode_in_chunks(model: Transformer, src, tgt, chunks):
    cache = model.start_cache(model.encode(src), src)
    out, pos = [], 0
    for n in chunks:
        logits, cache = model.decode(tgt[:, pos:pos + n], cache)
        out.append(logits)
        pos += n
    assert pos == tgt.size(1) and cache.length == pos
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("chunks", [[1] * 9, [2, 3, 2, 2], [3, 1, 2, 3], [9]], ids=["1-by-1", "2-3-2-2", "3-1-2-3", "all"])
def test_cached_decoding_equals_full_forward(variant_model, rand_tokens, chunks):
    model = variant_model
    src = rand_tokens([7, 3, 5])
    tgt = with_bos(rand_tokens([8, 8, 8], vocab=model.cfg.target_vocab_size))
    full = model(src, tgt)
    cached = decode_in_chunks(model, src, tgt, chunks)
    assert cached.shape == full.shape
    assert (cached - full).abs().max().item() < 1e-5


@pytest.mark.parametrize("kernel", ["weight-only-bf16", "int_mm", "fbgemm"])
def test_int8_quantised_model_decodes_like_its_full_forward(make_model, rand_tokens, kernel, monkeypatch):
    """int8 weights (every nn.Linear, decode/precision.py) leave a model that still decodes
    with the cache, close to the float model with each kernel: dequantised to bf16, or an
    int8 GEMM (torch._int_mm, fbgemm's), which quantises the activations too (a looser bound
    on this 16-wide model)."""
    from transformer.decode import choose
    from transformer.decode.int8 import fbgemm_available
    from transformer.decode.precision import for_inference

    if kernel == "fbgemm" and not fbgemm_available():
        pytest.skip("this torch build has no fbgemm")
    monkeypatch.setattr(choose, "int8_kernels", lambda shapes: dict.fromkeys(shapes, kernel))
    native_bf16 = kernel == "weight-only-bf16"
    model = make_model()
    qmodel = for_inference(model, "int8")
    src = rand_tokens([7, 3, 5])
    tgt = with_bos(rand_tokens([8, 8, 8], vocab=model.cfg.target_vocab_size))
    float_logits = model(src, tgt)
    bound = 0.05 if native_bf16 else 0.08
    for logits in (qmodel(src, tgt).float(), decode_in_chunks(qmodel, src, tgt, [1] * 9).float()):
        assert 0 < (logits - float_logits).abs().max().item() < bound * float_logits.abs().max().item()


def test_start_cache_projects_each_layers_cross_kv(make_model, rand_tokens):
    """The cross-attention K/V of all decoder layers come from one matmul over the memory;
    each layer's pair must equal that layer's own k_proj / v_proj of the memory."""
    model = make_model()
    src = rand_tokens([7, 3, 5])
    memory = model.encode(src)
    cache = model.start_cache(memory, src)
    assert len(cache.cross_kv) == len(model.decoder.layers) > 1
    for (k, v), layer in zip(cache.cross_kv, model.decoder.layers):
        attn = layer.cross_attn
        torch.testing.assert_close(k, attn.split_heads(attn.k_proj(memory)), rtol=0, atol=1e-6)
        torch.testing.assert_close(v, attn.split_heads(attn.v_proj(memory)), rtol=0, atol=1e-6)


def test_cached_decoding_in_train_mode_without_dropout(make_model, rand_tokens):
    """Training mode takes the same path (no eval-only fast path) when dropout is 0."""
    model = make_model(norm_first=True).train()
    src, tgt = rand_tokens([6, 2]), with_bos(rand_tokens([5, 5]))
    assert (decode_in_chunks(model, src, tgt, [1, 2, 3]) - model(src, tgt)).abs().max().item() < 1e-5


@pytest.mark.parametrize("kind", ["dropout", "attn_dropout"])
def test_dropout_is_active_in_train_mode_only(make_model, rand_tokens, kind):
    model = make_model(**{kind: 0.3})
    src, tgt = rand_tokens([6]), with_bos(rand_tokens([5]))
    no_dropout = make_model()  # the same seed: the same weights
    torch.testing.assert_close(model(src, tgt), no_dropout(src, tgt), rtol=0, atol=1e-6)
    model.train()
    torch.manual_seed(0)
    assert not torch.allclose(model(src, tgt), model(src, tgt))


# ---- attention weights on request -----------------------------------------------------------

def test_return_weights_shapes_and_structure(make_model, rand_tokens):
    model = make_model(n_layers=2, n_heads=2)
    src = rand_tokens([6, 3])
    tgt = with_bos(rand_tokens([4, 4]))
    memory, enc_w = model.encode(src, return_weights=True)
    torch.testing.assert_close(memory, model.encode(src))  # asking for weights changes nothing
    assert len(enc_w) == 2 and all(w.shape == (2, 2, 6, 6) for w in enc_w)
    assert (enc_w[0][1, :, :, 3:] == 0).all()  # padded source keys get no weight
    cache = model.start_cache(memory, src)
    logits, _, dec_w = model.decode(tgt, cache, return_weights=True)
    torch.testing.assert_close(logits, model.decode(tgt, cache)[0])
    assert len(dec_w) == 2
    for self_w, cross_w in dec_w:
        assert self_w.shape == (2, 2, 5, 5) and cross_w.shape == (2, 2, 5, 6)
        upper = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
        assert (self_w[..., upper] == 0).all()
        assert (self_w[..., ~upper] > 0).all()
        assert (cross_w[1, ..., 3:] == 0).all()
        torch.testing.assert_close(self_w.sum(-1), torch.ones(2, 2, 5))
        torch.testing.assert_close(cross_w.sum(-1), torch.ones(2, 2, 5))


def test_return_weights_with_a_cache(make_model, rand_tokens):
    model = make_model()
    src = rand_tokens([5])
    tgt = with_bos(rand_tokens([4]))
    cache = model.start_cache(model.encode(src), src)
    _, cache, _ = model.decode(tgt[:, :2], cache, return_weights=True)
    _, _, w = model.decode(tgt[:, 2:], cache, return_weights=True)
    self_w, cross_w = w[0]
    assert self_w.shape == (1, 2, 3, 5) and cross_w.shape == (1, 2, 3, 5)
    full_self = model.decode(tgt, model.start_cache(model.encode(src), src), return_weights=True)[2][0][0]
    assert (self_w - full_self[:, :, 2:]).abs().max().item() < 1e-6


# ---- options change the computation as documented -------------------------------------------

def test_sublayer_connection_post_and_pre_norm(tiny_cfg):
    x = torch.randn(2, 3, 16)
    sub = torch.nn.Linear(16, 16)
    for norm_first in (False, True):
        block = SublayerConnection(tiny_cfg.replace(norm_first=norm_first))
        with torch.no_grad():
            block.norm.weight.uniform_(0.5, 1.5)
            block.norm.bias.uniform_(-0.5, 0.5)
        out, extra = block(x, lambda h: (sub(h), "extra"))
        expected = x + sub(block.norm(x)) if norm_first else block.norm(x + sub(x))
        torch.testing.assert_close(out, expected)
        assert extra == "extra"


@pytest.mark.parametrize("activation,fn", [("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu)])
def test_feed_forward_activations(tiny_cfg, activation, fn):
    ffn = FeedForward(tiny_cfg.replace(ffn_activation=activation))
    assert ffn.gate is None
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ffn(x), ffn.fc2(fn(ffn.fc1(x))))


def test_swiglu_has_the_gate_matrix(tiny_cfg):
    ffn = FeedForward(tiny_cfg.replace(ffn_activation="swiglu"))
    assert ffn.gate.weight.shape == (32, 16)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(ffn(x), ffn.fc2(ffn.fc1(x) * F.silu(ffn.gate(x))))
    relu = Transformer(tiny_cfg).num_parameters()
    swiglu = Transformer(tiny_cfg.replace(ffn_activation="swiglu")).num_parameters()
    assert swiglu - relu == 2 * 2 * (16 * 32 + 32)  # one gate per FFN, 2 encoder + 2 decoder layers


def test_pre_norm_changes_the_model_output(make_model, rand_tokens):
    post = make_model()
    pre = make_model(norm_first=True, final_norm=False)  # the same parameter names
    pre.load_state_dict(post.state_dict())
    src, tgt = rand_tokens([5]), with_bos(rand_tokens([3]))
    assert (pre(src, tgt) - post(src, tgt)).abs().max().item() > 1e-3
    with_final = make_model(norm_first=True)
    assert with_final.encoder.norm is not None and with_final.decoder.norm is not None
    assert post.encoder.norm is None


# ---- gradients ------------------------------------------------------------------------------

def test_gradcheck_tiny_float64_model():
    """Back-propagation through the whole model matches finite differences for a few
    parameters (embedding, attention, FFN, LayerNorm) in float64."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=7, d_model=8, n_heads=2, d_ff=12, n_layers=1, dropout=0.0, max_len=16)
    model = Transformer(ModelConfig(**cfg)).double().eval()
    src = torch.tensor([[3, 4, 5, 2], [6, 2, 0, 0]])
    tgt = torch.tensor([[1, 5, 3], [1, 4, 0]])
    names = ["src_embed.weight", "encoder.layers.0.self_attn.q_proj.weight",
             "decoder.layers.0.cross_attn.v_proj.bias", "decoder.layers.0.ffn.fc1.weight",
             "decoder.layers.0.self_block.norm.weight"]
    params = dict(model.named_parameters())
    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)

    def f(*ps):
        logits = functional_call(model, {**params, **dict(zip(names, ps))}, (src, tgt))
        return torch.log_softmax(logits, -1)[..., 3:].sum(-1)  # a non-trivial scalar per position

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)
