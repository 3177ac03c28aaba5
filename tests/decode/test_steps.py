"""Each search is written once over a step (decode/steps.py): language-model generation gives
the same tokens on the growing cache's step and on the fixed-shape step (run eagerly here;
compiled: tests/lm/test_generate_compiled.py), through left padding, the sliding window and
stop tokens; the step is chosen by the one decision, static.should_compile."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig
from transformer.decode import generate, sample, static
from transformer.decode.steps import FixedShapeStep, GrowingStep
from transformer.model import LanguageModel


def small_lm(positions: str) -> LanguageModel:
    torch.manual_seed(0)
    preset = "llama-char" if positions == "rope" else "nanogpt-char"
    model = LanguageModel(ModelConfig.preset(preset, vocab_size=30, max_len=16, d_model=16, n_heads=2, d_ff=32,
                                             n_layers=2, positions=positions))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6)  # sharp: no near-ties for rounding to break
    return model.eval()


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_generation_is_one_loop_over_either_step(positions, monkeypatch):
    model = small_lm(positions)
    prompts = [[5, 6, 7], [9] * 10, [3]]  # left padding; 24 new tokens slide the 16-position window

    def run(make_step, **kw):
        monkeypatch.setattr(sample, "search_step", lambda model, compile, **_: make_step(model))
        return generate(model, prompts, 24, compile="off", **kw)

    for kw in (dict(temperature=0.0), dict(temperature=0.9, top_k=8, seed=3), dict(temperature=1.0, seed=1, stop_id=7)):
        eager = run(lambda m: GrowingStep(m, logprobs=False), **kw)
        assert run(lambda m: FixedShapeStep(m, logprobs=False), **kw) == eager


def test_the_step_a_search_runs_is_one_decision(make_model, monkeypatch):
    model = make_model()
    assert isinstance(static.search_step(model, "off"), GrowingStep)
    monkeypatch.setattr(static, "compiled_step", lambda model, logprobs: "compiled")
    step = static.search_step(model, "on", group=4, rows=static.MAX_COMPILED_ROWS)
    assert isinstance(step, FixedShapeStep) and step.run == "compiled"
    assert isinstance(static.search_step(model, "on", group=4, rows=static.MAX_COMPILED_ROWS + 1), GrowingStep)
    monkeypatch.setattr(static, "has_package", lambda *a, **kw: False)
    assert isinstance(static.search_step(model, "auto"), GrowingStep)  # auto: only a step built already
    with pytest.raises(ValueError, match="compile must be one of auto, on, off, got True"):
        static.search_step(model, True)
