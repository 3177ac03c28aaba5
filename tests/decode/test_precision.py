"""Decoding precision (fp32 / bf16 / int8): what is converted, that the caller's model is left
alone, that logits stay close to fp32, that both searches run at every precision, and that
int8 decoding warns about nothing."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from transformer.decode import beam_search, greedy_search
from transformer.decode import choose, int8, precision
from transformer.decode.decoding_copy import DecodingAttention
from transformer.decode.int8 import INT8_KERNELS, Int8Linear, fbgemm_available
from transformer.decode.precision import PRECISIONS, for_inference
from transformer.model.attention import MultiHeadAttention

QUANTISED = Int8Linear


def logits_of(model, src, tgt):
    with torch.inference_mode():
        return model(src, tgt).float()


def test_fp32_decodes_the_models_own_weights_and_leaves_its_modules_alone(make_model):
    """fp32 of a float32 model copies no weight (the copy's parameters are the model's), and
    what decoding changes in its copy (attention weights fused, eval mode) stays there."""
    model = make_model().train()
    full = for_inference(model, "fp32")
    assert full is not model and not full.training and model.training
    assert all(a is b for a, b in zip(full.parameters(), model.parameters()))
    assert {type(m) for m in model.modules()} >= {MultiHeadAttention} and DecodingAttention not in {
        type(m) for m in model.modules()}
    assert DecodingAttention in {type(m) for m in full.modules()}


def test_fp32_of_a_bf16_model_is_a_float32_copy(make_model):
    model = make_model().to(torch.bfloat16)
    full = for_inference(model, "fp32")
    assert full is not model and {p.dtype for p in full.parameters()} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_bf16_converts_a_copy(make_model):
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    low = for_inference(model, "bf16")
    assert low is not model and not low.training
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
    for k, v in model.state_dict().items():  # the caller's model is untouched
        assert v.dtype == before[k].dtype and torch.equal(v, before[k]), k


def test_int8_quantises_every_linear_and_the_tied_output_projection(make_model):
    model = make_model()
    assert model.out_proj is None  # tied
    q = for_inference(model, "int8")
    assert isinstance(q.out_proj, QUANTISED)
    assert not any(type(m) is nn.Linear for m in q.modules())
    # each self-attention's Q, K, V also as one layer of their rows (decode/int8_fused.py)
    fused = [m.qkv for m in q.modules() if hasattr(m, "qkv")]
    assert len(fused) == model.cfg.n_layers * 2  # (the encoder's and the decoder's)
    assert sum(isinstance(m, QUANTISED) for m in q.modules()) == sum(
        type(m) is nn.Linear for m in model.modules()) + 1 + len(fused)
    assert model.out_proj is None and not any(isinstance(m, QUANTISED) for m in model.modules())
    assert all(m.qweight.dtype == torch.int8 and m.scale.shape == (m.out_features,)
               for m in q.modules() if isinstance(m, QUANTISED))
    # the tied projection is the target embedding's rows, quantised
    torch.testing.assert_close(q.out_proj.weight(), model.tgt_embed.weight,
                               atol=model.tgt_embed.weight.abs().max().item() / 127, rtol=0)


def test_int8_linear_is_symmetric_per_row():
    """One scale per output row, the row's largest |w| at +-127; the layer computes
    x W'^T + b with W' the dequantised weight, in bfloat16 (to its rounding)."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 24)
    with torch.no_grad():
        lin.weight[3] *= 100  # one large row must not coarsen the others
        lin.weight[5] = 0  # nor a zero row divide by zero
    q = Int8Linear.from_linear(lin)
    w = lin.weight.detach()
    assert q.qweight.abs().amax(dim=1).tolist() == [127] * 5 + [0] + [127] * 18
    assert ((q.weight() - w).abs() <= q.scale[:, None] / 2 + 1e-7).all()
    x = torch.randn(10, 64)
    ref = nn.functional.linear(x, q.weight(), lin.bias)
    with torch.inference_mode():
        got = q(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("tied", [True, False])
def test_logits_stay_close_to_fp32(make_model, rand_tokens, precision, tied):
    model = make_model(tie_embeddings=tied, output_bias=True)
    with torch.no_grad():
        model.out_bias.normal_()
    src = rand_tokens([7, 3, 5])
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), rand_tokens([6, 6, 6])], dim=1)
    ref = logits_of(model, src, tgt)
    got = logits_of(for_inference(model, precision), src, tgt)
    err = (got - ref).abs().max().item()
    assert 0 < err < 0.05 * ref.abs().max().item()
    # the ranking that decoding uses mostly survives
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


@pytest.mark.parametrize("kernel", INT8_KERNELS)
@pytest.mark.parametrize("tied", [True, False])
def test_int8_decoding_warns_about_nothing_and_stays_close_to_fp32(make_model, rand_tokens, tied, kernel, monkeypatch):
    """Building the int8 copy and decoding with it raise no warning of any kind; a model of
    a realistic width (d_model 128) keeps its fp32 logits to within a few hundredths with
    every kernel: weight-only (dequantised to bf16 or fp32) and the two int8 GEMMs, which
    quantise the activations too (each row by its own range)."""
    if kernel == "fbgemm" and not fbgemm_available():
        pytest.skip("this torch build has no fbgemm")
    monkeypatch.setattr(choose, "int8_kernels", lambda shapes: dict.fromkeys(shapes, kernel))
    max_err, mean_err = (0.02, 0.005) if kernel.startswith("weight-only") else (0.04, 0.01)
    model = make_model(vocab_size=64, d_model=128, n_heads=4, d_ff=256, tie_embeddings=tied, output_bias=True)
    src = rand_tokens([9, 4, 7], vocab=64)
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), rand_tokens([8, 8, 8], vocab=64)], dim=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = for_inference(model, "int8")
        exact = kernel != "int_mm" or int8.int_mm_exact()  # elsewhere int_mm layers take fbgemm
        expected = kernel if exact else "fbgemm" if fbgemm_available() else "weight-only-fp32"
        assert {m.kernel for m in q.modules() if isinstance(m, Int8Linear)} == {expected}
        got = logits_of(q, src, tgt)
        greedy_search(q, src, max_len_b=10)
        beam_search(q, src, beam_size=3, max_len_b=10)
    ref = logits_of(model, src, tgt)
    err = (got - ref).abs()
    assert err.max().item() < max_err * ref.abs().max().item() and err.mean().item() < mean_err * ref.abs().max().item()
    # the ranking decoding uses survives wherever fp32's best leads its second by more than
    # twice the largest error (an untrained model's near-ties may flip either way)
    top2 = ref.topk(2, dim=-1).values
    clear = top2[..., 0] - top2[..., 1] > 2 * err.max()
    assert clear.float().mean() > 0.5 and (got.argmax(-1) == ref.argmax(-1))[clear].all()


@pytest.mark.parametrize("kernel", INT8_KERNELS)
def test_int8_translates_a_sentence_alone_as_in_a_batch(make_model, rand_tokens, kernel, monkeypatch):
    """No int8 kernel lets one row's values change another's: an int8 GEMM's outputs for a row
    are the same bits alone as beside others (fbgemm on its own quantises its whole input by
    one range: a row beside a larger one lost precision), so beam search gives a sentence the
    same hypotheses alone as in a batch, padded beside longer ones (scores to rounding)."""
    if kernel == "fbgemm" and not fbgemm_available():
        pytest.skip("this torch build has no fbgemm")
    monkeypatch.setattr(choose, "int8_kernels", lambda shapes: dict.fromkeys(shapes, kernel))
    layer = Int8Linear.from_linear(torch.nn.Linear(128, 96), kernel)
    x = torch.randn(6, 128)
    x[2] *= 50  # a row of much larger values than the others
    with torch.inference_mode():
        together, alone = layer(x), torch.cat([layer(row[None]) for row in x])
    if layer.int8_gemm:  # the same integer sums, rescaled alike (a float GEMM may round a row differently)
        assert torch.equal(together, alone)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    model = make_model(vocab_size=64, d_model=128, n_heads=4, d_ff=256, output_bias=True)
    with torch.no_grad():
        model.out_bias.normal_()
    q = for_inference(model, "int8")
    src = rand_tokens([9, 4, 7, 2], vocab=64)
    together = beam_search(q, src, beam_size=3, n_best=3, max_len_b=10)
    for i, hyps in enumerate(together):
        alone = beam_search(q, src[i:i + 1, : int((src[i] != model.cfg.pad_id).sum())], beam_size=3, n_best=3,
                            max_len_b=10)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], abs=1e-4)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_both_searches_run_at_every_precision(decoder_model, ragged_src, precision):
    model = for_inference(decoder_model, precision)
    eos = model.cfg.eos_id
    for hyps in (greedy_search(model, ragged_src, max_len_b=12), beam_search(model, ragged_src, beam_size=3, max_len_b=12)):
        assert len(hyps) == ragged_src.size(0)
        for h in hyps:
            assert h[0].tokens[-1] == eos and eos not in h[0].tokens[:-1]
            assert torch.isfinite(torch.tensor(h[0].score))


def test_unknown_precision_is_refused(make_model):
    with pytest.raises(ValueError, match="fp32, bf16, int8"):
        for_inference(make_model(), "fp16")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_for_inference_draws_nothing_from_the_global_rng(make_model, precision):
    """Training validates through for_inference: it must not move the RNG that dropout and
    batching use, or a resumed run would differ from a straight one."""
    for model in (make_model(), make_model(tie_embeddings=False, output_bias=True)):
        before = torch.get_rng_state()
        for_inference(model, precision)
        assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("preset", ["nanogpt-char", "llama-char"])
def test_int8_of_a_tied_language_model_quantises_its_head_and_stays_close_to_fp32(preset):
    """A language model's tied head is its ``embed`` (the translation model's is ``tgt_embed``):
    int8 gives it a quantised projection of its own, and the logits stay close to fp32."""
    from transformer import ModelConfig
    from transformer.model import LanguageModel

    torch.manual_seed(0)
    cfg = ModelConfig.preset(preset, vocab_size=23).replace(d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                                              max_len=40, dropout=0.0, tie_embeddings=True)
    model = LanguageModel(cfg).eval()
    assert model.out_proj is None
    q = for_inference(model, "int8")
    assert isinstance(q.out_proj, QUANTISED) and model.out_proj is None
    torch.testing.assert_close(q.out_proj.weight(), model.embed.weight,
                               atol=model.embed.weight.abs().max().item() / 127, rtol=0)
    tokens = torch.randint(1, 23, (2, 9))
    with torch.inference_mode():
        ref, low = model(tokens).float(), q(tokens).float()
    assert (ref - low).abs().max() < 0.05 * ref.abs().max()
    assert (ref.argmax(-1) == low.argmax(-1)).float().mean() > 0.9


def test_int_mm_is_used_only_where_its_sums_are_exact(monkeypatch):
    """oneDNN without VNNI (an AVX2-only CPU, the AVX2 stand-in) adds int8 products in
    saturating 16-bit pairs: there an int_mm layer takes fbgemm's GEMM, and precision auto's
    measurement never times int_mm."""
    from transformer.decode import choose, int8

    monkeypatch.setattr(int8, "_INT_MM_EXACT", [])
    real = torch._int_mm

    def saturating(a, b):  # as oneDNN's AVX2 kernels: a shifted to uint8, 16-bit pair sums, compensated
        shifted = a.int() + 128
        pairs = (shifted.view(a.size(0), -1, 2)[:, :, :, None] * b.int().view(-1, 2, b.size(1))[None]).sum(2)
        return (pairs.clamp(-32768, 32767).sum(1) - 128 * b.int().sum(0)).int()

    monkeypatch.setattr(torch, "_int_mm", saturating)
    assert not int8.int_mm_exact()
    lin = torch.nn.Linear(16, 8)
    layer = int8.Int8Linear.from_linear(lin, "int_mm")
    assert layer.kernel == ("fbgemm" if int8.fbgemm_available() else "weight-only-fp32")
    assert "int_mm" not in choose.names_to_time()
    monkeypatch.setattr(int8, "_INT_MM_EXACT", [])
    monkeypatch.setattr(torch, "_int_mm", real)
    assert int8.int_mm_exact() == torch.equal(real(torch.full((8, 256), 127, dtype=torch.int8),
                                                        torch.full((256, 16), -127, dtype=torch.int8)),
                                                   torch.full((8, 16), -127 * 127 * 256, dtype=torch.int32))
