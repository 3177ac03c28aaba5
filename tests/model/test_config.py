"""ModelConfig: validation, presets, immutability, and the paper's parameter counts."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer import ModelConfig, Transformer


def test_d_model_must_be_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(3\)"):
        ModelConfig(vocab_size=10, d_model=10, n_heads=3)


def test_unknown_activation_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="ffn_activation.*swiglu.*'tanh'"):
        ModelConfig(vocab_size=10, ffn_activation="tanh")


def test_unknown_sinusoid_layout_is_rejected():
    with pytest.raises(ValueError, match="sinusoid_layout"):
        ModelConfig(vocab_size=10, sinusoid_layout="rotary")


def test_tied_embeddings_need_one_vocabulary():
    with pytest.raises(ValueError, match="tie_embeddings"):
        ModelConfig(vocab_size=10, tgt_vocab_size=12, tie_embeddings=True)
    cfg = ModelConfig(vocab_size=10, tgt_vocab_size=12, tie_embeddings=False)
    assert cfg.target_vocab_size == 12
    # the same size is one shared vocabulary: tying is allowed
    assert ModelConfig(vocab_size=10, tgt_vocab_size=10).tie_embeddings


@pytest.mark.parametrize("field,value,extra", [
    ("pad_id", 10, {}),
    ("bos_id", -1, {}),
    ("eos_id", 10, {}),
    ("eos_id", 7, dict(tgt_vocab_size=7, tie_embeddings=False)),  # inside the source vocab, not the target's
])
def test_special_ids_outside_the_vocabulary_are_rejected(field, value, extra):
    with pytest.raises(ValueError, match=f"{field}={value} is outside the vocabulary"):
        ModelConfig(vocab_size=10, **{field: value}, **extra)


@pytest.mark.parametrize("bad", [dict(vocab_size=0), dict(vocab_size=10, dropout=1.0),
                                 dict(vocab_size=10, attn_dropout=-0.1), dict(vocab_size=10, max_len=1),
                                 dict(vocab_size=10, n_layers=0), dict(vocab_size=10, tgt_vocab_size=0,
                                                                       tie_embeddings=False)])
def test_other_invalid_values_are_rejected(bad):
    with pytest.raises(ValueError, match="ModelConfig"):
        ModelConfig(**bad)


@pytest.mark.parametrize("field,value,expected", [
    ("n_layers", 2.0, "n_layers must be an integer, got 2.0"),  # range(2.0) raised a TypeError
    ("d_model", "abc", "d_model must be an integer, got 'abc'"),  # was "'>' not supported between ..."
    ("max_len", 64.5, "max_len must be an integer, got 64.5"),
    ("bias", "maybe", "bias must be true or false, got 'maybe'"),  # a string was taken for True
    ("final_norm", 0, "final_norm must be true or false, got 0"),
    ("layer_norm_eps", "abc", "layer_norm_eps must be a number, got 'abc'"),
    ("n_kv_heads", 1.5, "n_kv_heads must be an integer, got 1.5"),
])
def test_a_value_of_the_wrong_type_is_rejected_by_name(field, value, expected):
    """A YAML model section or --set model.KEY=VALUE of the wrong type: one message naming the
    key, before any check compares or divides it (and before torch sees it)."""
    with pytest.raises(ValueError) as e:
        ModelConfig(vocab_size=10, **{field: value})
    assert str(e.value) == f"ModelConfig: {expected}"


def test_a_whole_number_is_a_fine_float():
    cfg = ModelConfig(vocab_size=10, dropout=0, rope_theta=10000, layer_norm_eps=1)
    assert (cfg.dropout, cfg.rope_theta, cfg.layer_norm_eps) == (0.0, 10000.0, 1.0)
    assert isinstance(cfg.rope_theta, float)


def test_config_is_frozen():
    cfg = ModelConfig(vocab_size=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 256  # type: ignore[misc]
    changed = cfg.replace(d_model=256, n_heads=4)
    assert (cfg.d_model, changed.d_model, changed.d_head) == (512, 256, 64)


def test_replace_validates_too():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(vocab_size=10).replace(n_heads=7)


def test_dict_round_trip_and_unknown_keys():
    cfg = ModelConfig(vocab_size=10, norm_first=True, tgt_vocab_size=9, tie_embeddings=False)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown keys \['n_head'\]"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_head": 8})


def test_paper_presets():
    base = ModelConfig.preset("base", vocab_size=37000)
    assert (base.n_layers, base.d_model, base.d_ff, base.n_heads, base.d_head, base.dropout) == (6, 512, 2048, 8, 64, 0.1)
    big = ModelConfig.preset("big", vocab_size=37000)
    assert (big.n_layers, big.d_model, big.d_ff, big.n_heads, big.d_head, big.dropout) == (6, 1024, 4096, 16, 64, 0.3)
    # the paper's defaults: post-norm, ReLU, no final norm, tied embeddings
    assert not base.norm_first and not base.use_final_norm and base.ffn_activation == "relu" and base.tie_embeddings
    assert ModelConfig.preset("tiny", vocab_size=100, dropout=0.0).dropout == 0.0  # overrides win
    for name in ("small", "tiny", "toy"):
        assert ModelConfig.preset(name, vocab_size=100).vocab_size == 100


def test_preset_errors():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        ModelConfig.preset("huge", vocab_size=10)
    with pytest.raises(ValueError, match="vocab_size is required"):
        ModelConfig.preset("base")


def test_final_norm_defaults_to_pre_norm_and_can_be_overridden():
    assert ModelConfig(vocab_size=10, norm_first=True).use_final_norm
    assert not ModelConfig(vocab_size=10, norm_first=False).use_final_norm
    assert not ModelConfig(vocab_size=10, norm_first=True, final_norm=False).use_final_norm


def analytic_count(cfg: ModelConfig) -> int:
    """Parameters of the paper's architecture, counted by hand (tied: one V x C matrix)."""
    c, f, n, v = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    mha = 4 * (c * c + c)  # W^Q, W^K, W^V, W^O with biases
    ffn = (c * f + f) + (f * c + c)
    ln = 2 * c
    encoder = n * (mha + ffn + 2 * ln)
    decoder = n * (2 * mha + ffn + 3 * ln)
    return v * c + encoder + decoder


@pytest.mark.parametrize("name,low,high", [("base", 60e6, 66e6), ("big", 205e6, 215e6)])
def test_paper_parameter_counts(name, low, high):
    """Table 3 of the paper: base 65M, big 213M (with a 37k shared BPE vocabulary)."""
    cfg = ModelConfig.preset(name, vocab_size=37000)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = Transformer(cfg)
    n = model.num_parameters()
    assert n == analytic_count(cfg)
    assert low <= n <= high, f"{name}: {n / 1e6:.1f}M parameters"


def test_pad_id_equal_to_eos_id_is_rejected():
    with pytest.raises(ValueError, match="pad_id.*eos_id|eos_id.*pad_id"):
        ModelConfig(vocab_size=10, pad_id=2, eos_id=2)


def test_pad_id_may_equal_bos_id():
    """HF Marian starts decoding from its pad id; that layout must stay valid."""
    cfg = ModelConfig(vocab_size=10, pad_id=0, bos_id=0, eos_id=2)
    assert cfg.pad_id == cfg.bos_id == 0
