"""An int8 decoding copy's fused projections (decode/int8_fused.py): each self-attention's Q, K, V
and a gated FFN's up and gate run as one int8 layer holding the separate layers' own rows (the
separate ones become views of it), with the same outputs; under grouped-query attention a
one-position step attends without copying K, V to every query head, to the same result."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig
from transformer.decode import choose, generate, int8
from transformer.decode.int8_fused import FusedInt8Attention, FusedInt8FeedForward
from transformer.decode.int8 import Int8Attention, Int8Linear, fbgemm_available
from transformer.decode.precision import for_inference
from transformer.model import LanguageModel
from transformer.model.attention import MultiHeadAttention


def gqa_model(seed: int = 0, qkv_bias: bool = True) -> LanguageModel:
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("llama-char", vocab_size=29).replace(d_model=64, n_heads=4, n_kv_heads=2, d_ff=96,
                                                                  n_layers=2, max_len=40, qkv_bias=qkv_bias)
    return LanguageModel(cfg).eval()


def kernels():
    out = ["weight-only-fp32", "weight-only-bf16"]
    if fbgemm_available():
        out.append("fbgemm")
    if int8.int_mm_exact():
        out.append("int_mm")
    return out


@pytest.mark.parametrize("kernel", kernels())
def test_fused_layers_are_the_separate_rows_with_the_same_outputs(kernel, monkeypatch):
    monkeypatch.setattr(choose, "int8_kernels", lambda shapes: dict.fromkeys(shapes, kernel))
    q = for_inference(gqa_model(), "int8")
    x = torch.randn(3, 5, 64)
    for layer in q.decoder.layers:
        attn, ffn = layer.self_attn, layer.ffn
        assert type(attn) is FusedInt8Attention and type(ffn) is FusedInt8FeedForward
        assert attn.qkv.kernel == ffn.up_gate.kernel == kernel
        parts = [(attn.qkv, (attn.q_proj, attn.k_proj, attn.v_proj)), (ffn.up_gate, (ffn.fc1, ffn.gate))]
        for fused, layers in parts:
            # the separate layers read their rows of the fused weights: one copy of them
            assert all(lin.qweight.untyped_storage().data_ptr() == fused.qweight.untyped_storage().data_ptr()
                       for lin in layers)
            with torch.inference_mode():
                together, apart = fused(x), torch.cat([lin(x) for lin in layers], dim=-1)
            if kernel in ("fbgemm", "int_mm"):  # the same integer sums, rescaled alike
                assert torch.equal(together, apart)
            else:
                torch.testing.assert_close(together, apart)
    assert not any(type(m) is Int8Attention for m in q.modules())


def test_a_model_without_gate_or_int8_keeps_its_modules():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("nanogpt-char", vocab_size=23).replace(d_model=32, n_heads=4, d_ff=64, n_layers=1,
                                                                    max_len=16)
    q = for_inference(LanguageModel(cfg).eval(), "int8")
    assert type(q.decoder.layers[0].ffn).__name__ == "FeedForward"  # GELU: nothing to fuse
    assert type(q.decoder.layers[0].self_attn) is FusedInt8Attention
    assert not any(isinstance(m, (FusedInt8Attention, FusedInt8FeedForward))
                   for m in for_inference(gqa_model(), "bf16").modules())


def test_grouped_attention_of_one_position_is_the_expanded_one():
    torch.manual_seed(0)
    attn = MultiHeadAttention(64, 8, n_kv_heads=2).eval()
    q, k, v = torch.randn(3, 8, 1, 8), torch.randn(3, 2, 11, 8), torch.randn(3, 2, 11, 8)
    mask = torch.rand(3, 1, 1, 11) > 0.3
    with torch.inference_mode():
        expected = [attn.attend(q, k, v, m)[0] for m in (mask, None)]
        attn.__class__ = FusedInt8Attention
        got = [attn.attend(q, k, v, m)[0] for m in (mask, None)]
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)
        # several positions (a prompt) and asked-for weights take the model's own path
        q4, causal = torch.randn(3, 8, 4, 8), torch.rand(3, 1, 4, 11) > 0.3
        assert torch.equal(attn.attend(q4, k, v, causal)[0], MultiHeadAttention.attend(attn, q4, k, v, causal)[0])
        out, weights = attn.attend(q, k, v, mask, need_weights=True)
        assert weights.shape == (3, 8, 1, 11)


def test_int8_generation_is_the_unfused_one(monkeypatch):
    """Greedy generation of a fused int8 copy gives the tokens of the same copy unfused (its
    layers' own rows, the same kernel), left-padded prompts of different lengths included."""
    kernel = "fbgemm" if fbgemm_available() else "weight-only-fp32"
    monkeypatch.setattr(choose, "int8_kernels", lambda shapes: dict.fromkeys(shapes, kernel))
    model = gqa_model(seed=3)
    fused = for_inference(model, "int8")
    monkeypatch.setattr("transformer.decode.int8_fused.fuse_projections", lambda m: m)
    plain = for_inference(model, "int8")
    assert not any(isinstance(m, FusedInt8Attention) for m in plain.modules())
    assert all(isinstance(m, Int8Linear) for m in (plain.decoder.layers[0].ffn.fc1, plain.out_proj))
    prompts = [[3, 4, 5, 6, 7], [8, 9]]
    assert generate(fused, prompts, 12, temperature=0) == generate(plain, prompts, 12, temperature=0)
