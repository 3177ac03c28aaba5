"""The float decoding copy (decode/decoding_copy.py): its attention weights fused once give the
model's numbers bit for bit; shapes measured faster through oneDNN multiply there (the output
projection included, tied or not, its bias added in the same call), within rounding of the
model's and with the same beam search output; a shape where oneDNN is level keeps F.linear. A
bf16 copy's shapes measured faster on oneDNN's packed weights hold those instead of the plain
ones and decode the same tokens; a compiled step gets the plain weights back."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from transformer.decode import beam_search, choose, decoding_copy
from transformer.decode.decoding_copy import (DecodingAttention, OneDnnLinear, OneDnnProjection, PackedLinear,
                                              onednn_available, onednn_packs)
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
    return tmp_path / "cache"


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


# --- bf16 on packed weights ---------------------------------------------------------------------

needs_bf16_packing = pytest.mark.skipif(not onednn_packs(torch.bfloat16),
                                        reason="oneDNN packs no bf16 weights on this CPU (or under an ISA limit)")


def tiny_lm(**overrides):
    from transformer import ModelConfig
    from transformer.model import LanguageModel

    torch.manual_seed(3)
    sizes = dict(vocab_size=50, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, n_layers=2, max_len=64)
    return LanguageModel(ModelConfig.preset("llama-char", **{**sizes, **overrides})).eval()


def packed_layers(model) -> list[PackedLinear]:
    return [m for m in model.modules() if type(m) is PackedLinear]


@needs_bf16_packing
@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "tgt_vocab_size": 11, "output_bias": True},
                                       {"ffn_activation": "swiglu", "norm_first": True}])
def test_a_bf16_copy_packs_the_shapes_measured_fastest_so_and_decodes_the_same(measuring, monkeypatch, make_model,
                                                                               rand_tokens, overrides):
    """Packed where measured fastest: every layer of the copy holds the packed weight instead of
    the plain one (no second copy), the projection packs a copy of its own; the beam search
    gives F.linear's hypotheses; the caller's model is untouched."""
    model = make_model(**overrides)
    before = {n: p.clone() for n, p in model.named_parameters()}
    fake_times(monkeypatch, slow=set(), fastest="bf16")  # F.linear: the reference copy
    plain = for_inference(model, "bf16")
    assert not packed_layers(plain) and not isinstance(vars(plain).get("project"), OneDnnProjection)
    monkeypatch.setattr(choose, "_memory", {})
    monkeypatch.setenv("TRANSFORMER_COMPILED_DIR", str(measuring / "again"))
    fake_times(monkeypatch, slow=set(), fastest=choose.PACKED)
    low = for_inference(model, "bf16")
    layers = packed_layers(low)
    assert layers and all("weight" not in m._parameters and m.packed.is_mkldnn for m in layers)
    assert isinstance(low.project, OneDnnProjection) and low.project.packed is not None
    selves = [layer.self_attn for layer in (*low.encoder.layers, *low.decoder.layers)]
    assert all(w.is_mkldnn for a in selves for w, _ in a.fused.values())  # (Q, K, V together: a shape measured too)
    assert sum(p.numel() for p in low.parameters()) < sum(p.numel() for p in plain.parameters())
    src = rand_tokens([7, 4, 6])
    assert decoded(low, src) == decoded(plain, src)
    assert not packed_layers(model) and "project" not in vars(model)
    assert all(torch.equal(p, before[n]) and p.dtype == torch.float32 for n, p in model.named_parameters())


@needs_bf16_packing
def test_a_language_model_on_packed_weights_generates_f_linears_tokens(measuring, monkeypatch):
    from transformer.decode import generate

    model = tiny_lm()
    fake_times(monkeypatch, slow=set(), fastest="bf16")
    plain = for_inference(model, "bf16")
    monkeypatch.setattr(choose, "_memory", {})
    monkeypatch.setenv("TRANSFORMER_COMPILED_DIR", str(measuring / "again"))
    fake_times(monkeypatch, slow=set(), fastest=choose.PACKED)
    low = for_inference(model, "bf16")
    assert len(packed_layers(low)) == 2 * 7 and low.project.packed is not None  # q, k, v, o, up, gate, down
    prompts = torch.randint(3, 50, (3, 5), generator=torch.Generator().manual_seed(0)).tolist()
    assert generate(low, prompts, 12, temperature=0) == generate(plain, prompts, 12, temperature=0)


@needs_bf16_packing
def test_a_packed_path_made_slow_is_not_chosen(measuring, monkeypatch, make_model):
    fake_times(monkeypatch, slow={choose.PACKED}, fastest="bf16-onednn")
    low = for_inference(make_model(), "bf16")
    assert not packed_layers(low) and any(type(m) is OneDnnLinear for m in low.modules())
    assert low.project.packed is None
    assert {s["bf16"] for s in choose.report(make_model())["shapes"]} == {"oneDNN"}


def test_packed_is_not_a_candidate_where_onednn_cannot_pack_bf16(measuring, monkeypatch, make_model):
    """Under the AVX2 stand-in oneDNN refuses to pack bf16: nothing is timed that way, and a
    copy packs nothing even if told to."""
    monkeypatch.setattr(choose, "onednn_packs", lambda dtype: False)
    monkeypatch.setattr(decoding_copy, "onednn_packs", lambda dtype: False)
    assert choose.PACKED not in choose.names_to_time()
    model = make_model().to(torch.bfloat16)
    shapes = {(m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    out = decoding_copy.prepare(model, shapes, shapes)
    assert not packed_layers(out)


def test_a_failed_measurement_packs_nothing_with_one_line(measuring, monkeypatch, make_model):
    monkeypatch.setattr(choose, "time_shape", lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        low = for_inference(make_model(), "bf16")
    assert not packed_layers(low) and not any(type(m) is OneDnnLinear for m in low.modules())
    assert [w.category for w in caught] == [choose.MeasureWarning] and "\n" not in str(caught[0].message)


@needs_bf16_packing
def test_a_compiled_step_gets_the_plain_weights_back_and_the_same_package_name(measuring, monkeypatch,
                                                                               rand_tokens):
    """The compiled step traces and names its package from the parameters: a packed copy is
    named as the plain copy of the same weights, and compiled.step makes it plain first (the
    same tokens)."""
    from transformer import compiled
    from transformer.compiled import build

    model = tiny_lm()
    fake_times(monkeypatch, slow=set(), fastest=choose.PACKED)
    low = for_inference(model, "bf16")
    plain = decoding_copy.prepare(copy.deepcopy(model).to(torch.bfloat16).eval())
    assert build.package_name(low, 1, True) == build.package_name(plain, 1, True)
    assert [n for n, _ in decoding_copy.named_weights(low)] == [n for n, _ in plain.named_parameters()]
    prompts = [[5, 6, 7, 8]]
    from transformer.decode import generate

    tokens = generate(low, prompts, 8, temperature=0)
    compiled.step(low, 1)  # (not built until its first call)
    assert not packed_layers(low) and low.project.packed is None
    assert [n for n, _ in low.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(low.parameters(), plain.parameters()))
    assert build.package_name(low, 1, True) == build.package_name(plain, 1, True)
    assert generate(low, prompts, 8, temperature=0) == tokens


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_step_under_grouped_query_attention_copies_no_k_v(monkeypatch, precision):
    """The copy's one-position steps attend to each K, V head as its group of queries instead of
    copying the heads (expand_kv runs for the prompt only); the logits stay within rounding of
    the copies' way, and fp32 generates the model's own tokens."""
    from transformer.decode import generate
    from transformer.model.attention import MultiHeadAttention

    model = tiny_lm()
    low = for_inference(model, precision)
    expanded = []
    real = MultiHeadAttention.expand_kv
    monkeypatch.setattr(MultiHeadAttention, "expand_kv", lambda self, k, v: expanded.append(k.size(2)) or real(self, k, v))
    prompts = torch.randint(3, 50, (3, 5), generator=torch.Generator().manual_seed(0)).tolist()
    tokens = generate(low, prompts, 10, temperature=0)
    assert expanded and set(expanded) == {5}  # the prompt's positions only: no step copied K, V
    if precision == "fp32":
        assert tokens == generate(model, prompts, 10, temperature=0)
    with torch.inference_mode():  # a step's logits, grouped against the copies' way
        ids = torch.tensor(prompts)
        _, cache = low.decode(ids, low.start_cache(3, ids.device))
        step = torch.tensor([[7], [8], [9]])
        grouped = low.decode(step, cache)[0].float()
        monkeypatch.setattr(decoding_copy, "grouped_attend", lambda *a: None)
        copied = low.decode(step, cache)[0].float()
    tol = 1e-5 if precision == "fp32" else 0.05
    torch.testing.assert_close(grouped, copied, atol=tol, rtol=tol)
