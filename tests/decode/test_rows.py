"""The rows a search keeps in the model's cache (decode/rows.py): reordered, repeated and
dropped with one index_select per tensor, beams of a sentence sharing its cross-attention K/V."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fake_caches import fake_cache
from transformer import KVCache
from transformer.decode.rows import expand_rows, select_rows


def test_select_rows_reorders_repeats_and_drops_rows():
    c = fake_cache(batch=3)
    idx = torch.tensor([2, 0, 0])
    r = select_rows(c, idx)
    assert r.batch_size == 3 and r.length == c.length
    for (k0, v0), (k1, v1) in zip(c.cross_kv + c.self_kv, r.cross_kv + r.self_kv):
        assert torch.equal(k1, k0[idx]) and torch.equal(v1, v0[idx])
    assert torch.equal(r.memory_mask, c.memory_mask[idx])
    assert r.self_kv[1][0][:, 0, 0, 0].tolist() == [102.0, 100.0, 100.0]
    dropped = select_rows(c, torch.tensor([1]))
    assert dropped.batch_size == 1 and dropped.cross_kv[0][0].size(0) == 1


def test_a_search_that_keeps_its_sentences_says_so_and_nothing_is_read():
    """Beams reordered within their sentences (every sentence kept, in order): with
    ``same_sentences`` the cross-attention K/V stay as they are, unchecked (no read from the
    device), and the rows equal the checked path's; the eager step says so for a full reorder."""
    from transformer.decode.eager_step import EagerStep

    c = expand_rows(fake_cache(batch=3), 2)
    order = torch.tensor([1, 1, 2, 3, 5, 4])  # row i takes row order[i], within its sentence
    checked, told = select_rows(c, order), select_rows(c, order, same_sentences=True)
    assert told.cross_kv is c.cross_kv and told.memory_mask is c.memory_mask
    for (k0, v0), (k1, v1) in zip(checked.self_kv, told.self_kv):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    assert torch.equal(checked.cross_kv[0][0], told.cross_kv[0][0])
    step = EagerStep(None)
    assert step.keep(c, order).cross_kv is c.cross_kv
    assert step.keep(c, torch.tensor([2, 3])).cross_kv[0][0].size(0) == 1  # fewer: whole groups gathered


def test_select_rows_keeps_empty_self_kv_and_leaves_the_original_alone():
    c = fake_cache()
    empty = KVCache(c.cross_kv, (None, None), c.memory_mask)
    r = select_rows(empty, torch.tensor([1, 1]))
    assert r.self_kv == (None, None) and r.batch_size == 2
    assert c.self_kv[0][0].size(0) == 3  # a new object; the cache is immutable
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.self_kv = ()  # type: ignore[misc]


def test_reordered_cache_decodes_like_reordered_inputs(make_model, rand_tokens):
    """A cache reordered with index_select gives the logits of the reordered batch."""
    model = make_model()
    src = rand_tokens([5, 3, 4], width=6)
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), rand_tokens([3, 3, 3])], 1)
    cache = model.start_cache(model.encode(src), src)
    _, cache = model.decode(tgt[:, :3], cache)
    idx = torch.tensor([2, 2, 0, 1])
    logits, _ = model.decode(tgt[idx, 3:], select_rows(cache, idx))
    expected = model(src[idx], tgt[idx])[:, 3:]
    assert (logits - expected).abs().max().item() < 1e-5


def test_grouped_cache_equals_replicated_cross_attention():
    """Beams of one sentence share its cross-attention K/V (group > 1): the logits and the
    weights must equal those of a cache that holds one copy per row."""
    from transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0)).eval()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    group = 3
    memory = model.encode(src)
    grouped = expand_rows(model.start_cache(memory, src), group)
    rows = torch.arange(2).repeat_interleave(group)
    replicated = select_rows(model.start_cache(memory, src), rows)
    assert grouped.group == group and grouped.cross_kv[0][0].size(0) == 2
    assert replicated.group == 1 and replicated.cross_kv[0][0].size(0) == 2 * group
    tokens = torch.randint(3, 20, (2 * group, 4))
    for t in range(4):
        step = tokens[:, t : t + 1]
        lg, grouped, wg = model.decode(step, grouped, return_weights=True)
        lr, replicated, wr = model.decode(step, replicated, return_weights=True)
        assert torch.allclose(lg, lr, atol=1e-6)
        for (sg, cg), (sr, cr) in zip(wg, wr):
            assert cg.shape == cr.shape == (2 * group, 2, 1, 4)
            assert torch.allclose(cg, cr, atol=1e-6) and torch.allclose(sg, sr, atol=1e-6)
        # a beam reorder that keeps both sentences copies no cross K/V ...
        order = torch.tensor([2, 0, 0, 4, 5, 3])
        grouped, replicated = select_rows(grouped, order), select_rows(replicated, order)
        assert grouped.cross_kv[0][0].size(0) == 2
    # ... and pruning the first sentence keeps only the second one's
    pruned = select_rows(grouped, torch.tensor([3, 4, 5]))
    assert pruned.cross_kv[0][0].size(0) == 1
    assert torch.equal(pruned.memory_mask, grouped.memory_mask[1:])
