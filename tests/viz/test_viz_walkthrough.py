"""``transformer explain``: the step-by-step recomputation is the model, bit for bit."""
from __future__ import annotations

import json
import math

import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer.viz.records import dims
from transformer.viz.walkthrough import walk

STEPS = ["1", "2", "3a", "3b", "3c", "4", "5", "6", "7", "8", "9", "10"]
VARIANTS = {
    "post-norm": {},
    "pre-norm": dict(norm_first=True),
    "swiglu": dict(ffn_activation="swiglu"),
    "untied": dict(tie_embeddings=False, tgt_vocab_size=11, output_bias=True),
    "concat-gelu": dict(sinusoid_layout="concat", ffn_activation="gelu"),
    "one-layer": dict(n_layers=1),
}


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                                max_len=64), **overrides})
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def piece(i: int) -> str:
    return {0: "<pad>", 1: "<s>", 2: "</s>"}.get(i, f"w{i}")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("tgt", [[5, 6, 7, 4], []], ids=["4-tokens", "empty-translation"])
def test_recomputation_equals_the_model_exactly(variant, tgt):
    model = tiny(**VARIANTS[variant])
    src_ids = [3, 4, 5, 6, 7, 8, 2]
    w = walk(model, src_ids, tgt, piece)
    src = torch.tensor([src_ids])
    tgt_in = torch.tensor([[1, *tgt]])
    with torch.no_grad():
        memory, _ = model.encode(src, return_weights=True)
        logits, _, _ = model.decode(tgt_in, model.start_cache(memory, src), return_weights=True)
        fused_memory = model.encode(src)  # torch's fused attention kernel: equal up to rounding
        fused_logits, _ = model.decode(tgt_in, model.start_cache(fused_memory, src))
    assert torch.equal(w.memory, memory)
    assert torch.equal(w.logits, logits)
    assert w.checks == {"memory_max_abs_diff": 0.0, "logits_max_abs_diff": 0.0}
    torch.testing.assert_close(w.memory, fused_memory, atol=1e-5, rtol=0)
    torch.testing.assert_close(w.logits, fused_logits, atol=1e-5, rtol=0)
    assert [s.number for s in w.steps] == STEPS


def test_numbers_say_what_the_seed_says():
    model = tiny()
    w = walk(model, [3, 4, 5, 6, 7, 8, 9, 2], [5, 6, 7], piece)
    step = {s.number: s for s in w.steps}
    n1 = step["1"].numbers
    assert n1["row_norm_after"] == pytest.approx(n1["row_norm_before"] * math.sqrt(16), rel=1e-3)
    assert step["2"].numbers["pe_pos0_first4"] == [0.0, 1.0, 0.0, 1.0]  # sin(0), cos(0)
    assert step["2"].numbers["pe_pos1_first4"][:2] == [round(math.sin(1), 4), round(math.cos(1), 4)]
    assert step["3b"].numbers["row_sum_max_abs_err"] < 1e-5
    n4 = step["4"].numbers
    assert n4["normalised_mean_max_abs"] < 1e-5 and n4["normalised_std"] == pytest.approx(1.0, abs=1e-3)
    assert 0.0 < step["5"].numbers["fraction_zeroed"] < 1.0
    assert step["6"].numbers["max_weight_above_diagonal"] == 0.0
    assert step["6"].numbers["first_row_self_weight"] == pytest.approx(1.0)
    assert step["7"].numbers["row_sum_max_abs_err"] < 1e-5
    top = step["10"].numbers["top5_last"]
    probs = [p for _, p in top]
    assert len(top) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
    assert step["10"].numbers["positions"] == 4  # three tokens and </s>


def test_relu_fraction_is_the_models():
    model = tiny()
    seen = {}
    hook = model.encoder.layers[0].ffn.fc1.register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
    try:
        w = walk(model, [3, 4, 5, 2], [5], piece)
    finally:
        hook.remove()
    assert w.steps[6].numbers["fraction_zeroed"] == pytest.approx(float((seen["h"] <= 0).float().mean()), abs=1e-4)


def test_shapes_name_their_dimensions():
    assert dims(("S", 9, "source tokens"), ("d_model", 128, None)) == "(S=9 source tokens, d_model=128)"
    w = walk(tiny(), [3, 4, 5, 6, 7, 8, 9, 10, 2], [5, 6], piece)
    assert "X_embed: (S=9 source tokens, d_model=16)" in w.steps[0].shapes
    assert any("(H=2 heads, T=3 target positions, S=9 source tokens)" in s for s in w.steps[8].shapes)


def test_explain_cli_text_and_json(cli, run_dir):
    sentence = "The animal didn't cross the street because it was too tired."
    r = cli("explain", "--model", run_dir, sentence, "--target", "Das Tier war zu müde.")
    assert r.code == 0, r.err
    order = [r.out.index(f"({n}) ") for n in STEPS]
    assert order == sorted(order)
    for term in ("词嵌入", "位置编码", "残差连接与归一化", "前馈神经网络", "掩码多头注意力", "交叉注意力", "线性层", "Softmax"):
        assert term in r.out
    assert "(bit-identical)" in r.out
    r = cli("explain", "--model", run_dir, sentence, "--beam", "1", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert [s["step"] for s in data["steps"]] == STEPS
    assert data["checks"] == {"memory_max_abs_diff": 0.0, "logits_max_abs_diff": 0.0}
    assert all(s["formula"] and s["code"].startswith("src/transformer/") for s in data["steps"])


def test_explain_one_step(cli, run_dir):
    r = cli("explain", "--model", run_dir, "A dog runs.", "--beam", "1", "--step", "3", "--step", "10")
    assert r.code == 0, r.err
    shown = [line.split(")")[0] + ")" for line in r.out.splitlines() if line.startswith("(")]
    assert shown == ["(3a)", "(3b)", "(3c)", "(10)"]


def test_explain_bad_input(cli, one_line_error, run_dir, tmp_path):
    one_line_error(cli("explain", "--model", run_dir, "Hello", "--step", "11"), "explain", "--step 11")
    one_line_error(cli("explain", "--model", run_dir, "  "), "explain", "the sentence is empty")
    one_line_error(cli("explain", "--model", tmp_path / "nope", "Hello"), "explain", "nope")
    one_line_error(cli("explain", "--model", run_dir, "Hello", "--beam", "0"), "explain", "--beam")
