"""``transformer explain`` on a language model: the step-by-step recomputation is the model,
bit for bit (GPT-style and Llama-style blocks), its numbers say what the seed says, and bad
prompts are one-line errors."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from transformer import ModelConfig
from transformer.cli import main
from transformer.decode.decoding_config import DecodingConfig
from transformer.inference.generator import Generator
from transformer.model import build_model
from transformer.model.rotary import apply_rotary
from transformer.run import load_model
from transformer.viz.walkthrough_lm import STEPS, token_shower, walk_lm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))  # tiny Hugging Face checkpoints
from hf_checkpoints import build_checkpoint  # noqa: E402

LM = dict(kind="decoder-only", vocab_size=17, d_model=16, n_heads=4, d_ff=24, n_layers=2, max_len=12, dropout=0.0,
          norm_first=True, final_norm=True, embed_scale=False)
VARIANTS = {
    "gpt": dict(norm="layer", positions="learned", ffn_activation="gelu", tie_embeddings=True),
    "llama": dict(norm="rms", positions="rope", ffn_activation="swiglu", bias=False, tie_embeddings=False),
    "llama-gqa": dict(norm="rms", positions="rope", ffn_activation="swiglu", bias=False, n_kv_heads=2,
                      tie_embeddings=False),
    "sinusoidal-relu-scaled": dict(norm="layer", positions="sinusoidal", ffn_activation="relu", embed_scale=True,
                                   output_bias=True),
    "post-norm": dict(norm="layer", positions="learned", norm_first=False, final_norm=False),
}


def tiny_lm(**overrides):
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**LM, **overrides}))
    with torch.no_grad():  # gains and biases away from 1 and 0, so that a test cannot pass because they are
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def show(i: int) -> str:
    return f"t{i}"


def reference(model, ids):
    tokens = torch.tensor([ids])
    with torch.no_grad():
        logits, _, weights = model.decode(tokens, model.start_cache(1), return_weights=True)
        return logits, weights, model(tokens)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("ids", [[3, 4, 5, 6, 7, 8, 9], [5], list(range(3, 15))], ids=["7-tokens", "1-token", "full"])
def test_recomputation_equals_the_model_exactly(variant, ids):
    model = tiny_lm(**VARIANTS[variant])
    w = walk_lm(model, ids, show, DecodingConfig(temperature=0.7, top_k=4))
    logits, _, fused = reference(model, ids)
    assert torch.equal(w.logits, logits)
    assert w.checks["bit_identical"] is True and w.checks["logits_max_abs_diff"] == 0.0
    torch.testing.assert_close(w.logits, fused, atol=1e-5, rtol=0)  # torch's fused kernel: equal up to rounding
    assert [s.number for s in w.steps] == STEPS


@pytest.mark.parametrize("run", ["trained_lm", "trained_llama"])
def test_a_trained_run_is_recomputed_bit_for_bit(run, request):
    path = request.getfixturevalue(run)
    model, _ = load_model(path)
    ids = [5, 6, 7, 3, 9, 10, 11, 4, 12]
    w = walk_lm(model, ids, show, DecodingConfig())
    assert torch.equal(w.logits, reference(model, ids)[0])


def test_numbers_say_what_the_seed_says():
    model = tiny_lm(**VARIANTS["llama"])
    ids = [3, 4, 5, 6, 7, 8, 9, 10]
    w = walk_lm(model, ids, show, DecodingConfig(temperature=0.5, top_k=3))
    step = {s.number: s.numbers for s in w.steps}
    logits, weights, _ = reference(model, ids)
    assert step["1"]["ids"] == ids and step["1"]["pieces"] == [show(i) for i in ids]
    rope = step["2"]
    assert rope["q_norm_after"] == pytest.approx(rope["q_norm_before"], abs=2e-4)  # a rotation keeps the length
    assert rope["score_shifted"] == pytest.approx(rope["score_p_0"], abs=1e-4)  # only the distance counts
    assert rope["angle_fastest_pair"] == len(ids) - 1
    layer = model.decoder.layers[0]
    with torch.no_grad():
        q, k, v = layer.self_attn.project_qkv(layer.self_block.norm(model.embed(torch.tensor([ids]))))
        cos, sin = model.rotary(torch.arange(len(ids))[None])
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    for name, t in (("q", q), ("k", k), ("v", v)):  # head 1's vectors of the last token, after the rotation
        assert step["3a"][f"head1_last_{name}_first4"] == [round(x, 4) for x in t[0, 0, -1, :4].tolist()]
    assert step["3b"]["max_weight_above_diagonal"] == 0.0  # the causal mask
    assert step["3b"]["first_row_self_weight"] == pytest.approx(1.0)
    assert step["3b"]["head1_last_row"] == [round(v, 3) for v in weights[0][0, 0, -1].tolist()]
    x = model.embed(torch.tensor([ids])).detach()  # layer 1's input: rotary adds nothing to X
    rms = x.pow(2).mean(-1).sqrt()
    assert step["4"]["rms_before"] == pytest.approx(float(rms.mean()), abs=1e-4)
    eps = model.cfg.layer_norm_eps  # RMSNorm divides by sqrt(mean(x^2) + eps): an RMS of 1 for large x
    assert step["4"]["rms_normalised"] == pytest.approx(float((rms / (rms ** 2 + eps).sqrt()).mean()), abs=1e-4)
    probs = logits[0, -1].softmax(-1)
    greedy = int(probs.argmax())
    assert step["9"]["greedy"] == show(greedy) and step["9"]["greedy_p"] == pytest.approx(float(probs[greedy]), abs=1e-4)
    assert step["9"]["sample_candidates"] == 3  # top-k 3
    sampled = (logits[0, -1] / 0.5).topk(3).values.softmax(-1)
    assert [p for _, p in step["9"]["sample_top5"]] == [round(float(p), 4) for p in sampled]
    nll = -logits[0, :-1].log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).mean()
    assert step["8"]["prompt_mean_nll"] == pytest.approx(float(nll), abs=1e-4)


def test_gated_ffn_numbers_are_the_models():
    model = tiny_lm(**VARIANTS["llama"])
    seen = {}
    def keep(module, args, out):
        seen.setdefault("x", args[0])
        seen.setdefault("gate", out)

    hook = model.decoder.layers[0].ffn.gate.register_forward_hook(keep)
    try:
        w = walk_lm(model, [3, 4, 5, 6], show, DecodingConfig())
    finally:
        hook.remove()
    assert w.steps[6].number == "5"
    gate = seen["gate"]
    assert w.steps[6].numbers["gate_negative"] == pytest.approx(float((gate < 0).float().mean()), abs=1e-4)
    assert w.steps[6].numbers["silu_gate_max"] == pytest.approx(float(torch.nn.functional.silu(gate).max()), abs=1e-4)
    with torch.no_grad():
        h = (model.decoder.layers[0].ffn.fc1(seen["x"].clone()) * torch.nn.functional.silu(gate.clone())).flatten() ** 2
    top = max(1, h.numel() // 100)
    assert w.steps[6].numbers["h_top1pct_share"] == pytest.approx(float(h.sort().values[-top:].sum() / h.sum()), abs=1e-4)
    assert any("W_gate, W_up: (d_model=16, d_ff=24) each" == s for s in w.steps[6].shapes)


# ---- the command --------------------------------------------------------------------------

def test_explain_a_prompt_text_and_json(cli, trained_llama):
    r = cli("explain", "--model", trained_llama, "the cat sat")
    assert r.code == 0, r.err
    order = [r.out.index(f"({n}) ") for n in STEPS]
    assert order == sorted(order)
    for term in ("词嵌入 We", "旋转位置编码", "因果掩码", "W_gate", "Whead", "Softmax", "(bit-identical)"):
        assert term in r.out
    r = cli("explain", "--model", trained_llama, "the cat sat", "--json", "--temperature", "0.8", "--top-k", "3")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["tokens"] == ["t", "h", "e", "▁", "c", "a", "t", "▁", "s", "a", "t"]
    assert data["checks"]["bit_identical"] is True
    assert [s["step"] for s in data["steps"]] == STEPS
    assert data["steps"][-1]["numbers"]["sample_candidates"] == 3


def test_explain_gpt_run_shows_learned_positions_and_one_step(cli, trained_lm):
    r = cli("explain", "--model", trained_lm, "a dog", "--step", "2", "--step", "3")
    assert r.code == 0, r.err
    shown = [line.split(")")[0] + ")" for line in r.out.splitlines() if line.startswith("(")]
    assert shown == ["(2)", "(3a)", "(3b)", "(3c)"]
    assert "Wpos" in r.out


@pytest.mark.parametrize("argv, mentions", [
    (["   "], ["the prompt is empty"]),
    (["the cat sat on the mat and then"], ["31 tokens", "context of 16"]),
    (["the cat", "--step", "10"], ["--step 10", "1..9"]),
    (["the cat", "--target", "x"], ["--target"]),
    (["the cat", "--temperature", "-1"], ["--temperature"]),
    (["the cat", "--lr", "0.1"], ["--training"]),
    (["the €"], ["'€'", "character vocabulary"]),
])
def test_bad_prompts_are_one_line_errors(cli, one_line_error, trained_lm, argv, mentions):
    one_line_error(cli("explain", "--model", trained_lm, *argv), "explain", *mentions)


def test_no_prompt_and_no_training(cli, one_line_error, trained_lm):
    one_line_error(cli("explain", "--model", trained_lm), "explain", "--training")


def test_context_length_prompt_is_accepted(cli, trained_lm):
    r = cli("explain", "--model", trained_lm, "the cat sat on a", "--step", "9")  # exactly 16 characters
    assert r.code == 0, r.err
    assert "(16 tokens)" in r.out
    assert math.isfinite(float(r.out.split("p = ")[1].split(")")[0]))


# ---- runs imported from tiny Hugging Face checkpoints (built in the test) ------------------

PAD_PROMPT = "Hello world! the quick"  # "!" is GPT-2's pad_id here: GPT-2 has no spare id, a real token pads


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """family -> (the HF model in eval mode, our run directory), each imported once."""
    pytest.importorskip("transformers", reason="the checkpoints are built with transformers")
    made = {}

    def get(family: str):
        if family not in made:
            root = tmp_path_factory.mktemp(family)
            folder, hf = build_checkpoint(family, root / "hf")
            assert main(["import", str(folder), "--out", str(root / "run")]) == 0
            made[family] = hf, root / "run"
        return made[family]
    return get


def test_rotary_step_shows_llama3_scaled_angles(cli, imported):
    """A Llama 3 import (rope_scaling): step 2 says so in both languages, and its angles are the
    ones the model turns q and k by (its cos / sin tables, HF's frequencies), not the unscaled
    theta^(-2i/d_k)."""
    hf, run = imported("llama3")
    prompt = "Hello world, the quick"
    r = cli("explain", "--model", run, prompt, "--json", "--step", "2")
    assert r.code == 0, r.err
    (step,) = json.loads(r.out)["steps"]
    n = step["numbers"]
    assert "Llama 3 scaling" in step["title"] and "Llama 3 频率缩放" in step["title_zh"]
    assert "f_i / 8 where the wavelength" in step["formula"] and "L = 16 positions" in step["formula"]
    model, _ = load_model(run)
    half = model.cfg.d_head // 2
    p = n["position"]
    assert p == len(Generator.from_pretrained(run, warn=False).encode(prompt)) - 1 and p > 1
    inv_freq = hf.model.rotary_emb.inv_freq.double()  # HF's llama3 frequencies
    for name, i in (("angle_fastest_pair", 0), ("angle_slowest_pair", half - 1)):
        angle = torch.tensor(n[name], dtype=torch.float64)
        assert float(angle) == pytest.approx(p * float(inv_freq[i]), rel=1e-5, abs=1e-6)
        assert float(angle.cos()) == pytest.approx(float(model.rotary.cos[p, i]), abs=1e-5)
        assert float(angle.sin()) == pytest.approx(float(model.rotary.sin[p, i]), rel=1e-4, abs=1e-6)
    unscaled = p * model.cfg.rope_theta ** (-2 * (half - 1) / model.cfg.d_head)
    assert n["unscaled_angle_slowest_pair"] == pytest.approx(unscaled, rel=1e-4)
    assert n["angle_slowest_pair"] == pytest.approx(unscaled / 8, rel=1e-4)  # factor 8: the slow pairs turn slower
    assert n["angle_fastest_pair"] < 0.99 * p  # pair 0 is blended here (wavelength 2 pi between 16 / 4 and 16 / 1)
    assert (n["pairs_slowed"], n["pairs_unchanged"], n["pairs_blended"]) == (3, 0, 1)
    r = cli("explain", "--model", run, prompt, "--step", "2")
    assert "(2) 位置编码（旋转位置编码 RoPE，Llama 3 频率缩放） / Rotary positions (RoPE, Llama 3 scaling)" in r.out
    assert "Llama 3 scaling: 3 of the 4 pairs turn 8 times slower" in r.out
    assert f"by {n['angle_slowest_pair']:.4g} rad" in r.out


def test_a_pad_id_that_is_a_real_token_is_read_as_one(cli, imported):
    """GPT-2 imported: its pad_id is a real token's ("!"); a prompt holding it is walked as the
    model reads it, and the logits are HF's."""
    hf, run = imported("gpt2")
    gen = Generator.from_pretrained(run, warn=False, precision="fp32")
    ids = gen.tokenizer.encode(PAD_PROMPT)
    assert gen.model.cfg.pad_id in ids[:-1]  # a later token has it as a key
    w = walk_lm(gen.model, ids, token_shower(gen.tokenizer), DecodingConfig())
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits
    torch.testing.assert_close(w.logits, theirs, atol=1e-5, rtol=0)
    assert w.checks["bit_identical"] is True and w.checks["fused_max_abs_diff"] < 1e-5
    r = cli("explain", "--model", run, PAD_PROMPT, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["checks"]["bit_identical"] is True and data["checks"]["fused_max_abs_diff"] < 1e-5
    pad_at = ids.index(gen.model.cfg.pad_id)
    step = {s["step"]: s["numbers"] for s in data["steps"]}
    assert step["3b"]["head1_last_row"][pad_at] > 0  # the last token attends to "!"
