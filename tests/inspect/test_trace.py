"""The trace (transformer.inspect.trace): without replacements it is the forward pass bit for
bit, for every model kind; replacements change what they name and what follows, and nothing
else; patching every value from one run into another reproduces that run."""
import pytest
import torch
from tiny_models import LM_VARIANTS, SRC, TGT, TOKENS, VARIANTS, build_model, tiny_lm

from transformer.inspect import Patch, position_mean, trace, trace_lm, trace_translation, value_names, zero


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_translation_trace_is_the_forward_pass_bit_for_bit(variant):
    model = build_model(**VARIANTS[variant])
    values = trace_translation(model, SRC, TGT)
    assert torch.equal(values["logits"], model(SRC, TGT))
    assert torch.equal(values["memory"], model.encode(SRC))
    assert list(values) == value_names(model)  # every name, in the order of the forward pass
    unpadded = trace(model, SRC[:1], TGT[:1])  # no mask at all: the fused kernel's other path
    assert torch.equal(unpadded["logits"], model(SRC[:1], TGT[:1]))


@pytest.mark.parametrize("variant", list(LM_VARIANTS))
def test_lm_trace_is_the_forward_pass_bit_for_bit(variant):
    model = tiny_lm(**LM_VARIANTS[variant])
    assert torch.equal(trace_lm(model, TOKENS)["logits"], model(TOKENS))  # left-padded: key mask, positions
    assert torch.equal(trace(model, TOKENS[:1])["logits"], model(TOKENS[:1]))  # CAUSAL, the fused kernel's is_causal
    assert list(trace(model, TOKENS[:1])) == value_names(model)


def test_the_values_are_what_the_model_computes():
    model = build_model(norm_first=True)
    v = trace_translation(model, SRC[:1], TGT[:1])
    memory, enc_w = model.encode(SRC[:1], return_weights=True)
    _, _, dec_w = model.decode(TGT[:1], model.start_cache(memory, SRC[:1]), return_weights=True)
    assert torch.allclose(v["enc.1.attn.weights"], enc_w[1], atol=1e-6)
    assert torch.allclose(v["dec.0.attn.weights"], dec_w[0][0], atol=1e-6)
    assert torch.allclose(v["dec.1.cross.weights"], dec_w[1][1], atol=1e-6)
    assert v["dec.0.cross.head_out"].shape == (1, 5, 2, 8)  # (B, T, H, D)
    assert v["enc.0.ffn.hidden"].shape == (1, 6, 32)
    assert torch.equal(v["enc.1.resid_pre"], v["enc.0.resid_post"])
    assert torch.equal(v["enc.final_norm"], v["memory"])
    # pre-norm: a layer's output is its input plus what each sub-layer wrote
    out = v["enc.0.resid_pre"] + v["enc.0.attn.out"] + v["enc.0.ffn.out"]
    assert torch.allclose(out, v["enc.0.resid_post"], atol=1e-5)


def test_explicit_attention_is_the_models_explicit_path():
    model = build_model()
    v = trace_translation(model, SRC, TGT, attention="explicit")
    memory, _ = model.encode(SRC, return_weights=True)
    logits, _, _ = model.decode(TGT, model.start_cache(memory, SRC), return_weights=True)
    assert torch.equal(v["logits"], logits)


def test_keep_and_logits_at():
    model = build_model()
    v = trace_translation(model, SRC, TGT, keep={"dec.1.resid_post", "logits"}, logits_at=[1, 3])
    assert set(v) == {"dec.1.resid_post", "logits"}
    assert torch.equal(v["logits"], model(SRC, TGT)[:, [1, 3]])
    assert set(trace(model, SRC, TGT, keep=lambda n: n.endswith("weights"))) == {
        f"{s}.{i}.{a}.weights" for s, a in (("enc", "attn"), ("dec", "attn"), ("dec", "cross")) for i in range(2)}


def test_patching_nothing_reproduces_a_and_everything_from_b_reproduces_b():
    model = build_model(norm_first=True)
    a_src, a_tgt, b_src, b_tgt = SRC[:1], TGT[:1], torch.tensor([[9, 8, 7, 6, 5, 2]]), torch.tensor([[1, 4, 4, 3, 9]])
    a, b = trace(model, a_src, a_tgt), trace(model, b_src, b_tgt)
    assert torch.equal(trace(model, a_src, a_tgt, replace={})["logits"], a["logits"])
    every = trace(model, a_src, a_tgt, replace=dict(b))
    assert torch.equal(every["logits"], b["logits"])
    # the residual stream alone carries a run: the last layer's output from B gives B's logits
    last = trace(model, a_src, a_tgt, replace={"dec.1.resid_post": b["dec.1.resid_post"]})
    assert torch.equal(last["logits"], b["logits"])
    lm = tiny_lm(preset="llama-300m", n_kv_heads=2)
    x, y = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[7, 8, 9, 10]])
    assert torch.equal(trace(lm, x, replace=dict(trace(lm, y)))["logits"], lm(y))


def test_a_replacement_changes_only_what_it_names_and_what_follows():
    model = build_model()
    clean = trace(model, SRC[:1], TGT[:1])
    v = trace(model, SRC[:1], TGT[:1], replace={"dec.1.attn.head_out": Patch(zero, positions=[2], heads=[1])})
    changed = v["dec.1.attn.head_out"]
    assert torch.all(changed[0, 2, 1] == 0)
    mask = torch.ones_like(changed, dtype=torch.bool)
    mask[0, 2, 1] = False
    assert torch.equal(changed[mask], clean["dec.1.attn.head_out"][mask])
    for name in value_names(model)[: value_names(model).index("dec.1.attn.head_out")]:
        assert torch.equal(v[name], clean[name]), name  # everything before it is as it was
    # causal: positions before 2 do not see the change; 2 does
    assert torch.equal(v["logits"][:, :2], clean["logits"][:, :2])
    assert not torch.equal(v["logits"][:, 2], clean["logits"][:, 2])


def test_replacements_by_tensor_and_by_function():
    model = build_model()
    clean = trace(model, SRC[:1], TGT[:1])
    v = trace(model, SRC[:1], TGT[:1], replace={"enc.0.ffn.hidden": 0.0, "dec.0.attn.head_out": position_mean})
    assert torch.all(v["enc.0.ffn.hidden"] == 0)
    mean = clean["dec.0.attn.head_out"].mean(1, keepdim=True)
    assert torch.equal(v["dec.0.attn.head_out"], mean.expand_as(v["dec.0.attn.head_out"]))
    weights = trace(model, SRC[:1], TGT[:1], replace={"enc.1.attn.weights": Patch(lambda w: torch.ones_like(w) / 6,
                                                                                     heads=[0])})
    v_heads = weights["enc.1.attn.v"][0, 0]  # (S, D): a uniform head's output is the mean of V
    assert torch.allclose(weights["enc.1.attn.head_out"][0, :, 0], v_heads.mean(0).expand(6, -1), atol=1e-6)


def test_ablating_a_head_is_zeroing_its_slice_of_w_o():
    for model, inputs, name in ((build_model(norm_first=True), (SRC, TGT), "dec.1.cross.head_out"),
                                (tiny_lm(preset="llama-300m", n_kv_heads=2), (TOKENS,), "dec.0.attn.head_out")):
        head, d = 1, model.cfg.d_head
        copy = type(model)(model.cfg).eval()
        copy.load_state_dict(model.state_dict())
        stack, layer, sub = name.split(".")[:3]
        mha = getattr((copy.encoder if stack == "enc" else copy.decoder).layers[int(layer)],
                      "cross_attn" if sub == "cross" else "self_attn")
        with torch.no_grad():
            mha.out_proj.weight[:, head * d:(head + 1) * d] = 0
        ablated = trace(model, *inputs, replace={name: Patch(zero, heads=[head])})["logits"]
        assert torch.allclose(ablated, copy(*inputs), atol=1e-6)
        assert not torch.allclose(ablated, model(*inputs), atol=1e-3)


def test_bad_names_and_indices_are_refused():
    model = build_model()
    with pytest.raises(ValueError, match="no value named enc.7.attn.out"):
        trace(model, SRC, TGT, replace={"enc.7.attn.out": zero})
    with pytest.raises(ValueError, match="head 5 is out of range"):
        trace(model, SRC, TGT, replace={"enc.0.attn.head_out": Patch(zero, heads=[5])})
    with pytest.raises(ValueError, match="has no heads"):
        trace(model, SRC, TGT, replace={"enc.0.resid_pre": Patch(zero, heads=[0])})
    with pytest.raises(ValueError, match="does not fit"):
        trace(model, SRC, TGT, replace={"enc.0.resid_pre": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="longer than the model's max_len"):
        trace(tiny_lm(), torch.ones(1, 40, dtype=torch.long))


def test_resuming_at_a_layer_gives_the_full_runs_values():
    from transformer.inspect.trace import Resume

    model = build_model(norm_first=True)
    src, tgt = SRC[:1], TGT[:1]
    full = trace(model, src, tgt)
    for stack in ("enc", "dec"):
        resumed = trace(model, src.expand(3, -1), tgt.expand(3, -1), resume=Resume(stack, 1, full))
        assert torch.allclose(resumed["logits"], full["logits"].expand(3, -1, -1), atol=1e-6)
        assert "dec.0.resid_post" not in resumed or stack == "enc"
        with pytest.raises(ValueError, match=f"no value named {stack}.0.attn.out"):
            trace(model, src, tgt, resume=Resume(stack, 1, full), replace={f"{stack}.0.attn.out": zero})
    lm = tiny_lm(preset="llama-300m", n_kv_heads=2)
    full = trace(lm, TOKENS[:1])
    resumed = trace(lm, TOKENS[:1].expand(2, -1), resume=Resume("dec", 1, full))
    assert torch.allclose(resumed["logits"], full["logits"].expand(2, -1, -1), atol=1e-6)
