"""Translation through the compiled step on a fixed-shape cache (transformer/compiled/): the
fixed-shape cache gives the growing cache's logits in every model variant; the one greedy and
one beam search give the same hypotheses on either step, the fixed-shape one run eagerly or
compiled."""
from __future__ import annotations

import pytest
import torch

from transformer import compiled
from transformer.compiled.build import step_module
from transformer.compiled.search_step import CompiledStep
from transformer.decode import greedy_search
from transformer.decode.beam import decode_beams
from transformer.decode.eager_step import EagerStep
from transformer.decode.greedy import decode_greedily
from transformer.decode.rows import expand_rows
from transformer.decode.scoring import max_output_lengths


def eager_fixed_shape(model, group: int = 1, logprobs: bool = True) -> CompiledStep:
    """The compiled step's search step with the step it compiles run eagerly."""
    return CompiledStep(model, lambda: step_module(model, group, logprobs), logprobs)


@pytest.fixture
def shrinks(monkeypatch) -> list[tuple[int, int]]:
    """Every time a compiled search shrinks its batch: (rows before, rows after)."""
    seen, keep = [], CompiledStep.keep

    def spy(self, cache, rows):
        if rows.numel() < cache.key_mask.size(0):
            seen.append((cache.key_mask.size(0), rows.numel()))
        return keep(self, cache, rows)

    monkeypatch.setattr(CompiledStep, "keep", spy)
    return seen


@pytest.mark.parametrize("padded", [True, False])
def test_the_fixed_shape_cache_gives_the_growing_caches_logits(variant_model, rand_tokens, padded):
    model = variant_model
    src = rand_tokens([7, 2, 5] if padded else [7, 7, 7], width=7)
    tgt = torch.tensor([[model.cfg.bos_id, 5, 6, 7, 8, 9], [model.cfg.bos_id, 3, 4, 4, 3, 5],
                        [model.cfg.bos_id, 9, 8, 7, 6, 5]])
    step = eager_fixed_shape(model, logprobs=False)
    with torch.inference_mode():
        cache = model.start_cache(model.encode(src), src)
        fixed = step.start(cache, 8)
        assert fixed.capacity == min(64, model.cfg.max_len)
        assert bool(fixed.memory_mask.all()) != padded  # held either way: a graph applies it
        for t in range(tgt.size(1)):
            want, cache = model.decode(tgt[:, t: t + 1], cache)
            got, fixed = step(tgt[:, t: t + 1], fixed)
            torch.testing.assert_close(got, want[:, -1])


def sharp_model(make_model):
    model = make_model(seed=2, output_bias=True)
    with torch.no_grad():
        for p in model.parameters():  # sharp logits: no near-ties for rounding to break
            if p.dim() == 2:
                p.mul_(4)
        model.out_bias[model.cfg.eos_id] = 2.0  # sentences end at different steps
    return model


@torch.inference_mode()
def test_one_search_gives_the_same_hypotheses_on_either_step(make_model, rand_tokens, shrinks):
    """The searches are written once: the growing cache's step (finished rows leave at
    once) and the fixed-shape step run eagerly (finished rows stay, unread, until half are
    done) give the same hypotheses, and equal scores (to float32's rounding: the fixed-shape
    step attends as a compiled graph does, with the matmul-softmax-matmul, where the eager
    float32 model calls torch's fused kernel)."""
    model = sharp_model(make_model)
    src = rand_tokens([7, 2, 5, 1, 4, 9, 3, 6, 8, 2], width=9)
    limits = max_output_lengths(src, model.cfg, 1.0, 8)

    def start(group=1):
        cache = model.start_cache(model.encode(src), src)
        return expand_rows(cache, group) if group > 1 else cache

    for min_length in (0, 4):
        eager = decode_greedily(EagerStep(model), start(), limits, model.cfg, min_length)
        fixed_shape = decode_greedily(eager_fixed_shape(model), start(), limits, model.cfg, min_length)
        assert [h[0].tokens for h in fixed_shape] == [h[0].tokens for h in eager]
        assert [h[0].score for h in fixed_shape] == pytest.approx([h[0].score for h in eager], abs=1e-4)
    assert shrinks and all(1 <= after <= before // 2 for before, after in shrinks)
    shrinks.clear()
    eager = decode_beams(EagerStep(model), start(4), limits, model.cfg, 4, 0.6, 2)
    fixed_shape = decode_beams(eager_fixed_shape(model, 4), start(4), limits, model.cfg, 4, 0.6, 2)
    assert [[h.tokens for h in hs] for hs in fixed_shape] == [[h.tokens for h in hs] for hs in eager]
    assert [h.score for hs in fixed_shape for h in hs] == pytest.approx([h.score for hs in eager for h in hs], abs=1e-4)
    assert shrinks and all(4 <= after <= before // 2 and after % 4 == 0 for before, after in shrinks)


def test_compiled_greedy_search_gives_the_eager_results(make_model, rand_tokens, shrinks, without_gemm_timing):
    # (the greedy step with the GEMM timing: tests/cli/test_cli_decoding.py)
    model = sharp_model(make_model)
    src = rand_tokens([7, 2, 5, 1, 4, 9, 3, 6, 8, 2], width=9)
    for kw in (dict(), dict(max_len_b=3), dict(min_length=4)):
        eager = greedy_search(model, src, **kw)
        got = greedy_search(model, src, step=compiled.step(model), **kw)
        assert [h[0].tokens for h in got] == [h[0].tokens for h in eager]
        assert [h[0].score for h in got] == pytest.approx([h[0].score for h in eager], abs=1e-4)
    lengths = {len(h[0].tokens) for h in eager}
    assert len(lengths) > 1  # the rows ended at different steps
    # finished rows left the batch at bucket boundaries: half or fewer still decoding
    assert shrinks and all(1 <= after <= before // 2 for before, after in shrinks)


@pytest.mark.parametrize("alpha, n_best, gemm_timing", [(0.6, 1, True), (1.0, 3, False)])
def test_compiled_beam_search_gives_the_eager_hypotheses(decoder_model, rand_tokens, alpha, n_best, gemm_timing,
                                                          shrinks, request):
    from transformer.decode import beam_search

    if not gemm_timing:
        request.getfixturevalue("without_gemm_timing")

    # sentences finish at different steps; the compiled search keeps their rows, unread,
    # until half of them are done, and then drops them
    src = rand_tokens([7, 2, 5, 1, 4, 9, 3, 6], width=9)
    eager = beam_search(decoder_model, src, beam_size=4, alpha=alpha, n_best=n_best, max_len_b=12)
    got = beam_search(decoder_model, src, beam_size=4, alpha=alpha, n_best=n_best, max_len_b=12,
                      step=compiled.step(decoder_model, 4))
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in eager]
    assert [h.score for hs in got for h in hs] == pytest.approx([h.score for hs in eager for h in hs], abs=1e-4)
    assert len({len(hs[0].tokens) for hs in eager}) > 1
    assert shrinks and all(4 <= after <= before // 2 and after % 4 == 0 for before, after in shrinks)
