"""The decoder-only language model: built from the encoder-decoder's parts, causal, its KV
cache equal to the full forward, left padding invisible to the real tokens, both families of
the seed (GPT-style and Llama-style) and their presets' parameter counts."""
from __future__ import annotations

import pytest
import torch

from transformer import ModelConfig
from transformer.model import LanguageModel, build_model
from transformer.model.layers import DecoderLayer

V = 23
SMALL = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=40, dropout=0.0)
FAMILIES = {
    "gpt": dict(ModelConfig.preset("nanogpt-char", vocab_size=V).to_dict(), **SMALL, bias=True),
    "llama": dict(ModelConfig.preset("llama-char", vocab_size=V).to_dict(), **SMALL),
    "llama-gqa": dict(ModelConfig.preset("llama-char", vocab_size=V).to_dict(), **SMALL, n_kv_heads=2),
    "sinusoidal-postnorm": dict(SMALL, kind="decoder-only", positions="sinusoidal", norm_first=False),
}


def make(family: str, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    model = LanguageModel(ModelConfig(**FAMILIES[family])).eval()
    with torch.no_grad():  # biases and norm gains away from 0 / 1, so that no test passes by luck
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, V, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=list(FAMILIES))
def model(request) -> LanguageModel:
    return make(request.param)


def test_the_layers_are_the_encoder_decoders_without_cross_attention(model):
    assert all(type(layer) is DecoderLayer and layer.cross_attn is None for layer in model.decoder.layers)


def test_no_future_token_changes_an_earlier_logit(model):
    x = tokens(2, 12)
    base = model(x)
    for t in (0, 5, 11):
        y = x.clone()
        y[:, t] = (y[:, t] - 3 + 1) % (V - 3) + 3  # another real token
        other = model(y)
        assert torch.equal(other[:, :t], base[:, :t])  # bit for bit before t
        assert not torch.allclose(other[:, t:], base[:, t:])  # and the change is seen from t on


@pytest.mark.parametrize("chunks", [[1] * 10, [4, 1, 5], [10]])
def test_cached_decoding_equals_the_full_forward(model, chunks):
    x = tokens(3, 10)
    full = model(x)
    cache, outs, start = model.start_cache(3), [], 0
    for n in chunks:
        logits, cache = model.decode(x[:, start:start + n], cache)
        outs.append(logits)
        start += n
    assert cache.length == 10 and cache.next_position.tolist() == [10] * 3
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_left_padding_is_invisible_to_the_real_tokens(model):
    """Rows of different lengths, left-padded, give each row the logits it has alone, in the
    full forward and through the cache."""
    rows = [tokens(1, 9, seed=2)[0], tokens(1, 4, seed=3)[0], tokens(1, 6, seed=4)[0]]
    width = max(len(r) for r in rows)
    batch = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    together = model(batch)
    cache = model.start_cache(3)
    first, cache = model.decode(batch, cache)
    nxt = tokens(3, 1, seed=5)
    step, cache = model.decode(nxt, cache)
    for i, r in enumerate(rows):
        alone = model(r[None])
        torch.testing.assert_close(together[i, width - len(r):], alone[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(first[i, width - len(r):], alone[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step[i, 0], model(torch.cat([r, nxt[i]])[None])[0, -1], rtol=1e-5, atol=1e-5)
    assert cache.next_position.tolist() == [len(r) + 1 for r in rows]


def test_select_returns_the_selected_rows(model):
    x = tokens(2, 7)
    select = torch.zeros(2, 7, dtype=torch.bool)
    select[0, 2:], select[1, :3] = True, True
    torch.testing.assert_close(model(x, select), model(x)[select], rtol=0, atol=1e-6)


def test_too_long_is_a_clear_error(model):
    with pytest.raises(ValueError, match="max_len=40"):
        model(tokens(1, 41))
    with pytest.raises(ValueError, match="max_len=40"):
        model(tokens(1, 41), padded=False)


def test_an_unpadded_window_gives_the_same_logits_and_cache_without_a_key_mask(model):
    """padded=False (training windows) skips the key mask and the position count: the same
    numbers, and a cache that decodes on as the default one does."""
    x = tokens(3, 10)
    assert torch.equal(model(x, padded=False), model(x))
    h, cache, _ = model.hidden(x[:, :6], model.start_cache(3), padded=False)
    assert cache.key_mask is None and cache.next_position.tolist() == [6] * 3
    logits, cache = model.decode(x[:, 6:], cache)
    torch.testing.assert_close(logits, model(x)[:, 6:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.project(h), model(x)[:, :6], rtol=1e-5, atol=1e-5)


def test_training_windows_reach_the_fused_kernel_as_is_causal_without_a_mask(model, monkeypatch):
    """Where only causality is masked (a window of the stream, or a prompt without padding),
    the fused kernel is called with is_causal=True and no mask tensor; left padding needs the
    tensor."""
    import torch.nn.functional as F

    calls, real = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is not None, is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model(tokens(3, 10), padded=False)
    model(tokens(3, 10))
    assert calls == [(False, True)] * (2 * model.cfg.n_layers)
    calls.clear()
    padded = tokens(2, 6)
    padded[1, :2] = model.cfg.pad_id
    model(padded)
    assert calls == [(True, False)] * model.cfg.n_layers


def test_grouped_query_attention_shares_kv_heads():
    gqa, full = make("llama-gqa"), make("llama")
    a = gqa.decoder.layers[0].self_attn
    assert a.k_proj.weight.shape == (2 * 8, 32) and a.q_proj.weight.shape == (32, 32)
    assert gqa.num_parameters() < full.num_parameters()


def test_llama_has_no_biases_and_gpt_ties_its_head():
    llama, gpt = make("llama"), make("gpt")
    assert not [n for n, _ in llama.named_parameters() if n.endswith("bias")]
    assert llama.out_proj is not None and gpt.out_proj is None


@pytest.mark.parametrize("preset, vocab, count", [
    ("gpt2-small", 50257, 124_439_808),  # GPT-2 small as published (tied head, 1,024 learned positions)
    ("nanogpt-char", 65, 804_096),  # nanoGPT prints 0.80M: this less its 8,192 position parameters
    ("llama-300m", 32000, 301_507_584),
])
def test_preset_parameter_counts(preset, vocab, count):
    cfg = ModelConfig.preset(preset, vocab_size=vocab)
    with torch.device("meta"):
        model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == count


def test_the_llama_300m_count_is_its_formula():
    """The count above, from the shapes: untied We and Whead, per layer WQ, WO (C x C), WK, WV
    (C x C/2 with 8 of 16 KV heads), three SwiGLU matrices and two RMSNorm gains, a final norm."""
    c, v, f, n = 1024, 32000, 2816, 20
    per_layer = 2 * c * c + 2 * c * (c // 2) + 3 * c * f + 2 * c
    assert 2 * v * c + n * per_layer + c == 301_507_584
