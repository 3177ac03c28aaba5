"""The float decoding copy (decode/decoding_copy.py): its attention weights fused once give the
model's numbers bit for bit; shapes measured faster through oneDNN multiply there (the output
projection included, tied or not, its bias added in the same call), within rounding of the
model's and with the same beam search output; a shape where oneDNN is level keeps F.linear."""
from __future__ import annotations

import pytest
import torch

from transformer.decode import beam_search, choose
from transformer.decode.decoding_copy import DecodingAttention, OneDnnLinear, OneDnnProjection, onednn_available
from transformer.decode.precision import for_inference

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring switched on (the suite runs with TRANSFORMER_MEASURE=off), in a cache of this
    test's own, nothing remembered from another test."""
    monkeypatch.delenv(choose.ENV_VAR, raising=False)
    monkeypatch.setenv("TRANSFORMER_COMPILED_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(choose, "_memory", {})
    monkeypatch.setattr(choose, "_failed", set())


def fake_times(monkeypatch, slow: set[str], fastest: str | None = None) -> None:
    """time_shape faked: ``fastest`` 1 ms a call, those in ``slow`` 10 ms, every other 2 ms."""
    monkeypatch.setattr(choose, "time_shape", lambda d_in, d_out, names: {
        n: 0.001 if n == fastest else 0.010 if n in slow else 0.002 for n in names})


def logits(model, src, tgt):
    with torch.inference_mode():
        return model(src, tgt).float()


def decoded(model, src):
    return [[h.tokens for h in hyps] for hyps in beam_search(model, src, beam_size=3, n_best=3, max_len_b=6)]


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "tgt_vocab_size": 11, "output_bias": True},
                                       {"output_bias": True}])
def test_fused_attention_weights_give_the_models_numbers_bit_for_bit(measuring, monkeypatch, make_model,
                                                                     rand_tokens, overrides):
    fake_times(monkeypatch, slow=set())  # oneDNN level with F.linear: not taken
    model = make_model(**overrides)
    full = for_inference(model, "fp32")
    assert not isinstance(getattr(full, "project"), OneDnnProjection)
    assert not any(type(m) is OneDnnLinear for m in full.modules())
    attns = [m for m in full.modules() if isinstance(m, DecodingAttention)]
    selves = [layer.self_attn for layer in (*full.encoder.layers, *full.decoder.layers)]
    assert selves and all(len(a.fused) == 1 for a in selves)  # each layer's q/k/v
    assert len(full.decoder.layers[0].cross_attn.fused) == 1  # the memory's K, V of every layer
    assert not any(a.cross_attn.fused for a in full.decoder.layers[1:])  # (a cross-attention's q runs alone)
    src, tgt = rand_tokens([7, 4, 6]), rand_tokens([5, 5, 3], vocab=11)
    assert torch.equal(logits(full, src, tgt), logits(model, src, tgt))
    assert decoded(full, src) == decoded(model, src)


def test_the_copy_keeps_its_hooks_and_modules_to_itself(make_model):
    """A hook on the copy's module (a profiler's marks) never runs on the caller's model."""
    model = make_model()
    full = for_inference(model, "fp32")
    seen = []
    full.decoder.layers[0].ffn.register_forward_hook(lambda *a: seen.append(1))
    full.decoder.layers[0].ffn.extra = torch.nn.Identity()
    with torch.inference_mode():
        model.encode(torch.tensor([[5, 6, 2]]))
        model.decoder.layers[0].ffn(torch.zeros(1, 1, model.cfg.d_model))
    assert seen == [] and not hasattr(model.decoder.layers[0].ffn, "extra")


@needs_onednn
@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "tgt_vocab_size": 11, "output_bias": True},
                                       {"output_bias": True}])
def test_shapes_measured_faster_through_onednn_multiply_there(measuring, monkeypatch, make_model, rand_tokens,
                                                              overrides):
    fake_times(monkeypatch, slow={"fp32"}, fastest="fp32-onednn")
    model = make_model(**overrides)
    full = for_inference(model, "fp32")
    assert isinstance(full.project, OneDnnProjection) and "project" not in vars(model)
    assert any(type(m) is OneDnnLinear for m in full.modules())
    assert not any(type(m) is OneDnnLinear for m in model.modules())  # the caller's model is left alone
    assert all(a is b for a, b in zip(full.parameters(), model.parameters()))
    called = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: called.append(1) or real(*a))
    src, tgt = rand_tokens([7, 4, 6]), rand_tokens([5, 5, 3], vocab=11)
    torch.testing.assert_close(logits(full, src, tgt), logits(model, src, tgt), atol=1e-5, rtol=1e-5)
    assert called  # oneDNN's operator ran
    assert decoded(full, src) == decoded(model, src)
    with torch.enable_grad():  # recording for backward: F.linear (oneDNN's operator has no derivative)
        n = len(called)
        model.train(False)
        full(src, tgt).sum().backward()
        assert len(called) == n and model.tgt_embed.weight.grad is not None


@needs_onednn
def test_bf16_copy_through_onednn_stays_close_to_fp32(measuring, monkeypatch, make_model, rand_tokens):
    fake_times(monkeypatch, slow={"bf16"}, fastest="bf16-onednn")
    model = make_model()
    low = for_inference(model, "bf16")
    assert isinstance(low.project, OneDnnProjection) and {p.dtype for p in low.parameters()} == {torch.bfloat16}
    src, tgt = rand_tokens([7, 4, 6]), rand_tokens([5, 5, 3], vocab=11)
    torch.testing.assert_close(logits(low, src, tgt), logits(model, src, tgt), atol=0.1, rtol=0.05)


@needs_onednn
def test_info_names_the_float_kernels(measuring, monkeypatch, make_model):
    fake_times(monkeypatch, slow={"fp32"}, fastest="fp32-onednn")
    report = choose.report(make_model())
    assert {s["fp32"] for s in report["shapes"]} == {"oneDNN"} and {s["bf16"] for s in report["shapes"]} == {"F.linear"}


def test_measuring_draws_nothing_from_the_global_rng():
    """Training validates in fp32, which now measures its kernels: the candidates' random layers
    come from a generator of their own, so a resumed run stays exact."""
    state = torch.get_rng_state()
    calls = choose.candidates(8, 12, 4, choose.names_to_time())
    for call, arg in calls.values():
        call(arg)
    assert torch.equal(torch.get_rng_state(), state)
