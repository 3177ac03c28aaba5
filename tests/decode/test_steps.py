"""Each search is written once over a step it is handed (decode/eager_step.py): language-model
generation gives the same tokens on the growing cache's step and on the compiled step's
fixed-shape one (run eagerly here; compiled: tests/lm/test_generate_compiled.py), through left
padding, the sliding window and stop tokens. Which step a search gets is the front door's one
decision (tests/run/test_front_door.py); no search imports the compiled package (test_import_rule.py)."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig
from transformer.compiled.build import step_module
from transformer.compiled.search_step import CompiledStep
from transformer.decode import generate
from transformer.decode.eager_step import EagerStep
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
def test_generation_is_one_loop_over_either_step(positions):
    model = small_lm(positions)
    prompts = [[5, 6, 7], [9] * 10, [3]]  # left padding; 24 new tokens slide the 16-position window

    def run(step, **kw):
        return generate(model, prompts, 24, step=step, **kw)

    fixed_shape = CompiledStep(model, lambda: step_module(model, 1, False), logprobs=False)
    for kw in (dict(temperature=0.0), dict(temperature=0.9, top_k=8, seed=3), dict(temperature=1.0, seed=1, stop_id=7)):
        eager = run(EagerStep(model, logprobs=False), **kw)
        assert run(None, **kw) == eager  # (the default: the eager step)
        assert run(fixed_shape, **kw) == eager
