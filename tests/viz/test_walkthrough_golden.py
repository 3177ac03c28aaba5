"""The walkthroughs' text and JSON, as ``transformer explain`` prints them, held against
copies kept in ``tests/viz/golden/``: the words (English and Chinese), the formulas, the
shapes and the order of the JSON keys must match to the letter; the numbers to the last
digit printed (one unit of it either way, so that another CPU's rounding does not matter).

One translation model and one Llama-style language model (RMSNorm, SwiGLU, rotary
positions, grouped-query attention), both tiny and random. After a change that is meant to
alter what the walkthrough says, rewrite the copies with
``python tests/viz/test_walkthrough_golden.py`` and read the diff.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from transformer import ModelConfig, Transformer
from transformer.decode.decoding_config import DecodingConfig
from transformer.model import build_model
from transformer.viz import walkthrough, walkthrough_lm

GOLDEN = Path(__file__).parent / "golden"
NUMBER = re.compile(r"-?\d+(?:\.(\d+))?(?:e([-+]\d+))?")


def _random(model):
    with torch.no_grad():  # gains and biases away from 1 and 0
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def translation_output() -> str:
    torch.manual_seed(0)
    model = _random(Transformer(ModelConfig(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0,
                                            max_len=64)))
    w = walkthrough.walk(model, [3, 4, 5, 6, 7, 8, 2], [5, 6, 7, 4], lambda i: {0: "<pad>", 1: "<s>", 2: "</s>"}.get(i, f"w{i}"))
    return walkthrough.format_text(w) + "\n" + json.dumps(walkthrough.to_dict(w), ensure_ascii=False, indent=1) + "\n"


def lm_output() -> str:
    torch.manual_seed(0)
    model = _random(build_model(ModelConfig(
        kind="decoder-only", vocab_size=17, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, n_layers=2, max_len=12,
        dropout=0.0, norm_first=True, final_norm=True, embed_scale=False, norm="rms", positions="rope",
        ffn_activation="swiglu", bias=False, tie_embeddings=False)))
    w = walkthrough_lm.walk_lm(model, [3, 4, 5, 6, 7, 8, 9], lambda i: f"t{i}", DecodingConfig(temperature=0.7, top_k=4))
    return walkthrough_lm.format_text(w) + "\n" + json.dumps(walkthrough_lm.to_dict(w), ensure_ascii=False, indent=1) + "\n"


OUTPUTS = {"translation.txt": translation_output, "lm.txt": lm_output}


def _unit(m: re.Match) -> float:
    """One unit of the last digit printed: 0.01 for "0.28", 1e-8 for "1.2e-07"."""
    decimals = len(m.group(1) or "")
    return 10.0 ** (-decimals + int(m.group(2) or 0))


def assert_same_up_to_rounding(got: str, want: str) -> None:
    got_lines, want_lines = got.splitlines(), want.splitlines()
    assert len(got_lines) == len(want_lines), f"{len(got_lines)} lines, the copy has {len(want_lines)}"
    for n, (g, w) in enumerate(zip(got_lines, want_lines), 1):
        if g == w:
            continue
        assert NUMBER.sub("#", g) == NUMBER.sub("#", w), f"line {n}:\n  got  {g}\n  want {w}"
        for a, b in zip(NUMBER.finditer(g), NUMBER.finditer(w)):
            tolerance = max(_unit(a), _unit(b)) * 1.01 + 1e-5
            assert abs(float(a.group()) - float(b.group())) <= tolerance, f"line {n}:\n  got  {g}\n  want {w}"


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_the_walkthrough_says_what_it_said(name):
    assert_same_up_to_rounding(OUTPUTS[name](), (GOLDEN / name).read_text(encoding="utf-8"))


def test_the_comparison_catches_a_changed_word_or_number():
    want = "(3b) 缩放与 Softmax / Scaling and softmax\n    mean largest weight 0.28; error 1.2e-07"
    assert_same_up_to_rounding(want.replace("0.28", "0.29").replace("1.2e-07", "0.0e+00"), want)  # a last digit
    with pytest.raises(AssertionError):
        assert_same_up_to_rounding(want.replace("0.28", "0.31"), want)
    with pytest.raises(AssertionError):
        assert_same_up_to_rounding(want.replace("缩放", "缩小"), want)


if __name__ == "__main__":  # rewrite the copies
    for name, make in OUTPUTS.items():
        (GOLDEN / name).write_text(make(), encoding="utf-8")
        print(f"wrote {GOLDEN / name}", file=sys.stderr)
