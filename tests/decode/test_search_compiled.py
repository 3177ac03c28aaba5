"""Translation through the compiled step on a fixed-shape cache (decode/static.py):
the fixed-shape cache gives the growing cache's logits in every model variant, and the
compiled searches (greedy and beam) give the eager searches' tokens, lengths and scores."""
from __future__ import annotations

import pytest
import torch

from transformer.decode import greedy_search
from transformer.model.cache import StaticKVCache


@pytest.fixture
def shrinks(monkeypatch) -> list[tuple[int, int]]:
    """Every time a compiled search shrinks its batch: (rows before, rows after)."""
    seen, select = [], StaticKVCache.select

    def spy(self, rows):
        seen.append((self.key_mask.size(0), rows.numel()))
        return select(self, rows)

    monkeypatch.setattr(StaticKVCache, "select", spy)
    return seen


@pytest.mark.parametrize("padded", [True, False])
def test_the_fixed_shape_cache_gives_the_growing_caches_logits(variant_model, rand_tokens, padded):
    model = variant_model
    src = rand_tokens([7, 2, 5] if padded else [7, 7, 7], width=7)
    tgt = torch.tensor([[model.cfg.bos_id, 5, 6, 7, 8, 9], [model.cfg.bos_id, 3, 4, 4, 3, 5],
                        [model.cfg.bos_id, 9, 8, 7, 6, 5]])
    with torch.inference_mode():
        cache = model.start_cache(model.encode(src), src)
        static = model.start_static_cache(cache, 8)
        assert (static.memory_mask is not None) == padded
        for t in range(tgt.size(1)):
            want, cache = model.decode(tgt[:, t: t + 1], cache)
            got = model.decode_static(tgt[:, t: t + 1], static)
            torch.testing.assert_close(got, want[:, -1])
        # several positions in one call: the last one's logits, as decode gives them
        again = model.start_static_cache(model.start_cache(model.encode(src), src), 8)
        torch.testing.assert_close(model.decode_static(tgt, again), got)


def test_compiled_greedy_search_gives_the_eager_results(make_model, rand_tokens, shrinks, without_gemm_timing):
    # (the greedy step with the GEMM timing: tests/cli/test_cli_decoding.py)
    model = make_model(seed=2, output_bias=True)
    with torch.no_grad():
        for p in model.parameters():  # sharp logits: no near-ties for rounding to break
            if p.dim() == 2:
                p.mul_(4)
        model.out_bias[model.cfg.eos_id] = 2.0  # sentences end at different steps
    src = rand_tokens([7, 2, 5, 1, 4, 9, 3, 6, 8, 2], width=9)
    for kw in (dict(), dict(max_len_b=3), dict(min_length=4)):
        eager = greedy_search(model, src, **kw)
        compiled = greedy_search(model, src, compile=True, **kw)
        assert [h[0].tokens for h in compiled] == [h[0].tokens for h in eager]
        assert [h[0].score for h in compiled] == pytest.approx([h[0].score for h in eager], abs=1e-4)
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
    compiled = beam_search(decoder_model, src, beam_size=4, alpha=alpha, n_best=n_best, max_len_b=12,
                           compile=True)
    assert [[h.tokens for h in hs] for hs in compiled] == [[h.tokens for h in hs] for hs in eager]
    assert [h.score for hs in compiled for h in hs] == pytest.approx([h.score for hs in eager for h in hs], abs=1e-4)
    assert len({len(hs[0].tokens) for hs in eager}) > 1
    assert shrinks and all(4 <= after <= before // 2 and after % 4 == 0 for before, after in shrinks)
