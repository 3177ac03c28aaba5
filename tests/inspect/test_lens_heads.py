"""The logit lens and head effects (transformer.inspect.lens / heads): the lens's last layer is
the model's own output distribution; a batched measure of every head equals one run per head;
patching from the corrupted input moves the score towards the corrupted one."""
import pytest
import torch
from tiny_models import SRC, TGT, TOKENS, build_model, tiny_lm

from transformer.inspect import Patch, Score, head_effects, logit_lens, trace, zero
from transformer.inspect.heads import head_out_name


@pytest.mark.parametrize("kind", ["post-norm", "pre-norm", "lm"])
def test_the_last_layer_of_the_lens_is_the_models_output(kind):
    if kind == "lm":
        model, inputs = tiny_lm(), (TOKENS[:1],)
    else:
        model, inputs = build_model(norm_first=kind == "pre-norm"), (SRC[:1], TGT[:1])
    lens = logit_lens(model, *inputs)
    out = model(*inputs)[0].log_softmax(-1)
    assert lens.layers == ["embed", "1", "2"]
    assert torch.equal(lens.log_probs[-1], out)
    assert torch.equal(lens.chosen, out.argmax(-1))
    assert torch.allclose(lens.chosen_prob[-1], out.max(-1).values.exp())
    probs, ids = lens.top(3)
    assert probs.shape == ids.shape == (3, inputs[-1].size(1), 3)
    assert torch.equal(ids[-1, :, 0], lens.chosen)


def test_a_middle_layer_of_the_lens_is_the_stream_through_the_final_norm():
    model = tiny_lm()
    lens = logit_lens(model, TOKENS[:1])
    h = trace(model, TOKENS[:1])["dec.0.resid_post"]
    assert torch.allclose(lens.log_probs[1], model.project(model.decoder.norm(h))[0].log_softmax(-1), atol=1e-6)


def score_for(model, inputs):
    """The log-probability of the model's own choice at every position."""
    chosen = model(*inputs)[0].argmax(-1).tolist()
    return Score(positions=list(range(len(chosen))), tokens=chosen)


@pytest.mark.parametrize("ablate", ["zero", "mean"])
def test_batched_head_ablation_equals_one_run_per_head(ablate):
    model = build_model(norm_first=True)
    inputs = (SRC[:1], TGT[:1])
    score = score_for(model, inputs)
    found = head_effects(model, inputs, score, ablate=ablate, rows=3)  # passes that cut through a layer's kinds
    assert set(found.effects) == {"enc.attn", "dec.attn", "dec.cross"}
    assert torch.allclose(torch.tensor(found.clean), score(model(*inputs)))
    for kind, table in found.effects.items():
        assert table.shape == (2, 2)
        for layer in range(2):
            for head in range(2):
                name = head_out_name(kind, layer)
                value = zero if ablate == "zero" else (lambda v: v.mean(1, keepdim=True).expand_as(v))
                alone = trace(model, *inputs, replace={name: Patch(value, heads=[head])})["logits"]
                assert abs(float(score(alone)[0]) - found.clean - float(table[layer, head])) < 1e-4, (kind, layer, head)
    assert any(t.abs().max() > 1e-3 for t in found.effects.values())


def test_patching_every_head_of_a_lm():
    model = tiny_lm(preset="llama-300m", n_kv_heads=2)
    clean, corrupt = torch.tensor([[3, 4, 5, 6, 7]]), torch.tensor([[3, 4, 9, 6, 7]])
    score = Score(positions=[4], tokens=[8], vs=[10])
    found = head_effects(model, (clean,), score, ablate="patch", corrupt=(corrupt,))
    assert found.corrupt == pytest.approx(float(score(model(corrupt).detach()[:, [4]])[0]), abs=1e-5)
    table = found.effects["dec.attn"]
    assert table.shape == (2, 4)
    for layer, head in ((0, 0), (1, 3)):
        alone = trace(model, clean, replace={f"dec.{layer}.attn.head_out": Patch(trace(model, corrupt)[
            f"dec.{layer}.attn.head_out"], heads=[head])})["logits"][:, [4]]
        assert float(score(alone)[0]) - found.clean == pytest.approx(float(table[layer, head]), abs=1e-4)


def test_patching_skips_the_encoder_when_the_sources_differ_in_length():
    model = build_model()
    score = score_for(model, (SRC[:1], TGT[:1]))
    found = head_effects(model, (SRC[:1], TGT[:1]), score, ablate="patch",
                         corrupt=(torch.tensor([[3, 4, 5, 2]]), TGT[:1]))
    assert set(found.effects) == {"dec.attn", "dec.cross"}
    assert "6 positions" in found.skipped["enc.attn"] or "4 positions" in found.skipped["enc.attn"]
    with pytest.raises(ValueError, match="needs corrupt inputs"):
        head_effects(model, (SRC[:1], TGT[:1]), score, ablate="patch")


def test_heads_of_one_layer_only():
    model = build_model()
    inputs = (SRC[:1], TGT[:1])
    score = score_for(model, inputs)
    every = head_effects(model, inputs, score)
    one = head_effects(model, inputs, score, layers=[1])
    for kind, table in one.effects.items():
        assert torch.isnan(table[0]).all()
        assert torch.allclose(table[1], every.effects[kind][1], atol=1e-6)
