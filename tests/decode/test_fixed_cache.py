"""The eager step's cache (decode/fixed_cache.py: K, V buffers allocated once per search, written
in place) gives the same bits as the model's growing KVCache: the same tokens and the same scores
in beam search (padding, finished sentences leaving, n-best), greedy search, an ensemble, and
language-model generation (left padding, the sliding window, stop tokens), in float32 and
bfloat16; and a search allocates no K, V buffers after its start."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import VARIANTS, build_model
from tests.decode.test_steps import small_lm
from transformer.decode import generate
from transformer.decode.beam import beam_search
from transformer.decode.eager_step import EagerStep, left_pad
from transformer.decode.ensemble import Ensemble
from transformer.decode.fixed_cache import BufferedKVCache, buffered
from transformer.decode.greedy import greedy_search
from transformer.decode.rows import expand_rows, select_rows


class GrowingStep(EagerStep):
    """The eager step on the model's own KVCache (concatenated every step): the reference."""

    def start(self, cache, need):
        return cache

    def prefill(self, prompts, need):
        ids, real = left_pad(prompts, self.model.cfg.pad_id, self.model.embed.weight.device)
        logits, cache = self.model.decode(ids, self.model.start_cache(len(prompts), ids.device), real=real)
        return cache, logits[:, -1]


def biased(model, eos_bias: float = -0.5):
    """EOS made likely enough that hypotheses end at varied lengths (sentences leave the batch)."""
    with torch.no_grad():
        model.out_bias[model.cfg.eos_id] = eos_bias
    return model


def same(found, expected):
    assert [[(h.tokens, h.score, h.logprob) for h in hyps] for hyps in found] == \
        [[(h.tokens, h.score, h.logprob) for h in hyps] for hyps in expected]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", [*VARIANTS, "gqa"])
def test_beam_and_greedy_search_give_the_growing_caches_bits(variant, dtype, rand_tokens):
    overrides = dict(n_heads=4, n_kv_heads=2) if variant == "gqa" else VARIANTS[variant]
    model = biased(build_model(seed=2, dtype=dtype, **{"output_bias": True, **overrides}))
    src = rand_tokens([7, 2, 5, 1, 4, 9], width=9)
    for beam, n_best in ((4, 1), (3, 3), (2, 2)):
        kw = dict(beam_size=beam, n_best=n_best, max_len_a=1.5, max_len_b=3)
        expected = beam_search(model, src, step=GrowingStep(model), **kw)
        assert {len(h.tokens) for hyps in expected for h in hyps} != {1}  # (sentences end at varied lengths)
        same(beam_search(model, src, step=EagerStep(model), **kw), expected)
        same(beam_search(model, src, **kw), expected)  # (the default step)
    same(greedy_search(model, src, max_len_b=5), greedy_search(model, src, max_len_b=5, step=GrowingStep(model)))


def test_an_ensemble_searches_on_each_members_fixed_cache(rand_tokens):
    models = [biased(build_model(seed=s, output_bias=True)) for s in (2, 3)]
    ensemble = Ensemble(models).eval()
    src = rand_tokens([6, 3, 8], width=8)
    for search, kw in ((beam_search, dict(beam_size=3, n_best=2)), (greedy_search, {})):
        same(search(ensemble, src, step=EagerStep(ensemble), **kw),
             search(ensemble, src, step=GrowingStep(ensemble), **kw))


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_generation_gives_the_growing_caches_tokens(positions):
    model = small_lm(positions)
    prompts = [[5, 6, 7], [9] * 10, [3]]  # left padding; 24 new tokens slide the 16-position window
    for kw in (dict(temperature=0.0), dict(temperature=0.9, top_k=8, seed=3), dict(temperature=1.0, seed=1, stop_id=7)):
        assert generate(model, prompts, 24, step=EagerStep(model, logprobs=False), **kw) == \
            generate(model, prompts, 24, step=GrowingStep(model, logprobs=False), **kw)


@torch.inference_mode()
def test_steps_write_into_the_buffers_allocated_at_the_start(rand_tokens):
    model = biased(build_model(seed=2, output_bias=True))
    src = rand_tokens([5, 3, 4], width=5)
    grown = expand_rows(model.start_cache(model.encode(src), src), 2)
    cache = buffered(model, grown, 6)
    assert isinstance(cache, BufferedKVCache)
    buffers = [*cache.buffers.k, *cache.buffers.v]
    storage = {t.data_ptr() for pair in buffers for t in pair}
    tokens = torch.tensor([[1]] * 6)
    gen = torch.Generator().manual_seed(0)
    for rows in ([1, 0, 2, 3, 5, 4], [0, 0, 3, 3, 4, 5], [2, 3, 0, 1], [1, 1]):  # reorder, then sentences leave
        logits, cache = model.decode(tokens, cache)
        expected, grown = model.decode(tokens, grown)
        assert torch.equal(logits, expected)
        assert [*cache.buffers.k, *cache.buffers.v] == buffers  # (the same lists, each of the same two)
        assert {t.data_ptr() for pair in buffers for t in pair} == storage
        for i in range(model.cfg.n_layers):
            for held, old in zip((cache.buffers.k[i][0], cache.buffers.v[i][0]), grown.self_kv[i]):
                assert torch.equal(held.view(-1)[: old.numel()].view(old.shape), old)
        rows = torch.tensor(rows)
        cache, grown = select_rows(cache, rows), select_rows(grown, rows)
        tokens = torch.randint(3, 13, (rows.numel(), 1), generator=gen)
        assert cache.batch_size == grown.batch_size and cache.length == grown.length
        assert torch.equal(cache.memory_mask, grown.memory_mask)
        assert all(torch.equal(a, b) for x, y in zip(cache.cross_kv, grown.cross_kv) for a, b in zip(x, y))


@torch.inference_mode()
def test_a_step_past_the_capacity_is_refused(rand_tokens):
    model = build_model(seed=2)
    src = rand_tokens([3, 2], width=3)
    cache = buffered(model, model.start_cache(model.encode(src), src), 2)
    tokens = torch.tensor([[1], [1]])
    for _ in range(2):
        _, cache = model.decode(tokens, cache)
    with pytest.raises(ValueError, match="holds 2 positions of 2 rows; 2 rows of 2 \\+ 1 positions do not fit"):
        model.decode(tokens, cache)
    with pytest.raises(ValueError, match="3 rows asked of a cache of 2"):
        select_rows(cache, torch.tensor([0, 1, 1]))


def test_the_eager_steps_reorder_within_sentences_asks_nothing_of_their_order(monkeypatch):
    """A beam reorder (as many rows as the cache holds) keeps the sentences' cross-attention
    K/V as they are without comparing the rows' sentences with their order (a read of the
    device per step), as select_rows does for the model's cache; fewer rows still pick theirs."""
    from transformer.decode import rows as rows_module

    model = build_model(seed=5).eval()
    src = torch.randint(4, model.cfg.vocab_size, (3, 5))
    step = EagerStep(model)
    compared = []

    class Spy:  # rows.py's torch, recording the comparison's arange
        def __getattr__(self, name):
            if name == "arange":
                compared.append(1)
            return getattr(torch, name)

    with torch.inference_mode():
        cache = step.start(expand_rows(model.start_cache(model.encode(src), src), 2), 8)
        _, cache = step(torch.full((6, 1), model.cfg.bos_id), cache)
        monkeypatch.setattr(rows_module, "torch", Spy())
        kept = step.keep(cache, torch.tensor([1, 0, 2, 3, 5, 4]))
        assert compared == [] and kept.cross_kv is cache.cross_kv
        fewer = step.keep(cache, torch.tensor([0, 1, 4, 5]))  # (sentences 0 and 2: finished rows leave)
        assert fewer.rows == 4 and fewer.memory_mask.size(0) == 2
