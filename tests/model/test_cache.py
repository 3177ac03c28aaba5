"""KVCache: length, batch size, cross K/V computed once (the rows a search keeps: tests/decode/test_rows.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fake_caches import fake_cache
from transformer import KVCache


def test_length_and_batch_size():
    c = fake_cache(batch=3, t=4)
    assert (c.length, c.batch_size) == (4, 3)
    empty = KVCache(c.cross_kv, (None, None), c.memory_mask)
    assert empty.length == 0


def test_cross_attention_kv_is_computed_once(make_model, rand_tokens):
    model = make_model()
    src = rand_tokens([4, 2])
    cache = model.start_cache(model.encode(src), src)
    assert cache.length == 0 and len(cache.cross_kv) == model.cfg.n_layers
    assert cache.cross_kv[0][0].shape == (2, 2, 4, 8)  # (B, H, S, D)
    _, grown = model.decode(torch.ones(2, 1, dtype=torch.long), cache)
    _, grown = model.decode(torch.full((2, 2), 5), grown)
    assert grown.length == 3 and grown.self_kv[1][0].shape == (2, 2, 3, 8)
    for before, after in zip(cache.cross_kv, grown.cross_kv):
        assert after[0] is before[0] and after[1] is before[1]  # the same tensors: never recomputed
    assert grown.memory_mask is cache.memory_mask
    assert cache.length == 0  # decode() returns a new cache and leaves its input as it was


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpadded_batches_skip_the_mask_with_the_same_numbers(make_model, rand_tokens, dtype):
    """Without padding, encoder and cross-attention run maskless: bit for bit what the
    all-True mask gives, on both attention paths (fused in fp32, explicit in bf16)."""
    model = make_model(seed=3, dtype=dtype)
    src = rand_tokens([6, 6, 6])
    tgt = rand_tokens([4, 4, 4])
    mask = model.src_mask(src)
    assert bool(mask.all())
    with torch.no_grad():
        x = model.positions(model.src_embed(src))
        assert torch.equal(model.encode(src), model.encoder(x, mask)[0])
        cache = model.start_cache(model.encode(src), src)
        assert not cache.padded and cache.attend_mask is None
        masked = dataclasses.replace(cache, padded=True)
        assert torch.equal(model.decode(tgt, cache)[0], model.decode(tgt, masked)[0])
    padded = model.start_cache(model.encode(rand_tokens([6, 3])), rand_tokens([6, 3]))
    assert padded.padded and padded.attend_mask is padded.memory_mask


def test_what_a_layer_asks_of_the_cache():
    """The decoder's cache interface: a layer extends its K, V by the new positions', the
    new positions' self-attention mask is causal over cached + new keys (None for one new
    position), padding keys hidden, and the grown cache holds what the layers returned."""
    c = fake_cache(batch=3, t=4)
    k, v = torch.ones(3, 2, 2, 5), -torch.ones(3, 2, 2, 5)
    k_all, v_all = c.layer(1).extend(k, v)
    assert k_all.shape == (3, 2, 6, 5)
    assert torch.equal(k_all[:, :, :4], c.self_kv[1][0]) and torch.equal(v_all[:, :, 4:], v)
    assert KVCache(c.cross_kv, (None, None), c.memory_mask).layer(0).extend(k, v) == (k, v)
    assert c.self_mask(1) is None
    assert c.self_mask(2)[0, 0].tolist() == [[True] * 5 + [False], [True] * 6]
    real = torch.tensor([[False, True, True, True, True, True]]).expand(3, 6)
    assert c.self_mask(2, real).shape == (3, 1, 2, 6) and not c.self_mask(2, real)[:, :, :, 0].any()
    grown = c.grown([(k_all, v_all), (k_all, v_all)])
    assert grown.length == 6 and grown.cross_kv is c.cross_kv
