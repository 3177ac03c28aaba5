"""Hugging Face Llama import/export: the same logits and the same greedy continuations as
``transformers.LlamaForCausalLM``, on tiny randomly initialised models (no download).

Padding: see ``lm_parity`` (PAD is 0 here, a real id to Llama that prompts never contain).
"""
import pytest
import torch
from lm_parity import NEW, check_greedy, check_logits, check_same_weights, hf_greedy, ours_greedy, randomize
from transformers import LlamaConfig, LlamaForCausalLM

from transformer import ModelConfig
from transformer.interop import from_llama, to_llama
from transformer.interop.llama import config_to_llama
from transformer.model.lm import LanguageModel

V, PAD, BOS, EOS = 89, 0, 1, 2
PROMPTS = [[5, 17, 33, 8, 61, 12, 40], [9, 22], [71, 3, 3, 50, 18], [44], [13, 27, 88, 6, 30, 52, 7, 19, 64]]


def llama_config(**overrides) -> LlamaConfig:
    kwargs = dict(vocab_size=V, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                  pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    return LlamaConfig(**{**kwargs, **overrides})


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    hf = LlamaForCausalLM(llama_config(**overrides)).eval()
    randomize(hf, seed, PAD)
    return hf


def tiny_ours(seed: int = 0, **overrides) -> LanguageModel:
    cfg = ModelConfig.preset("llama-char", vocab_size=V, **{"max_len": 64, "d_model": 32, "n_heads": 4,
                                                             "d_ff": 56, "n_layers": 2, **overrides})
    model = LanguageModel(cfg).eval()
    randomize(model, seed, PAD)
    return model


# ---- logits ---------------------------------------------------------------------------------
VARIANTS = {
    "untied": dict(),
    "gqa-untied": dict(num_key_value_heads=2),
    "mqa-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "tied-biases-theta": dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                              rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rms_norm_eps=1e-5),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_imported_model_gives_hf_logits(variant):
    hf = tiny_llama(**VARIANTS[variant])
    model = from_llama(hf)
    cfg = model.cfg
    assert not model.training
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (PAD, BOS, EOS)
    assert cfg.tie_embeddings == bool(hf.config.tie_word_embeddings)
    assert cfg.kv_heads == hf.config.num_key_value_heads
    assert (model.out_proj is None) == cfg.tie_embeddings
    check_logits(model, hf, PROMPTS, PAD, f"from_llama {variant}")


OURS = {
    "untied": dict(),
    "gqa": dict(n_kv_heads=2),
    "tied-biases": dict(tie_embeddings=True, bias=True, rope_theta=500.0),
}


@pytest.mark.parametrize("variant", list(OURS))
def test_exported_model_gives_our_logits(variant):
    model = tiny_ours(**OURS[variant])
    hf = to_llama(model)
    assert not hf.training
    assert hf.config.num_key_value_heads == model.cfg.kv_heads
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == model.cfg.tie_embeddings
    check_logits(model, hf, PROMPTS, PAD, f"to_llama {variant}")


def test_round_trip_keeps_every_weight():
    hf = tiny_llama(num_key_value_heads=2)
    check_same_weights(hf, to_llama(from_llama(hf)))


def test_llama_300m_preset_converts_to_the_same_parameter_count():
    cfg = ModelConfig.preset("llama-300m", vocab_size=32000)
    hf_cfg = config_to_llama(cfg)
    with torch.device("meta"):
        hf = LlamaForCausalLM(hf_cfg)
        ours = LanguageModel(cfg)
    assert hf.num_parameters() == ours.num_parameters()


# ---- greedy continuations ---------------------------------------------------------------------
GREEDY = {
    "import-gqa-untied": lambda: (from_llama(h := tiny_llama(1, num_key_value_heads=2)), h),
    "import-tied": lambda: (from_llama(h := tiny_llama(2, tie_word_embeddings=True)), h),
    "export-gqa-untied": lambda: ((m := tiny_ours(3, n_kv_heads=2)), to_llama(m)),
    "export-tied": lambda: ((m := tiny_ours(4, tie_embeddings=True)), to_llama(m)),
}


@pytest.mark.parametrize("variant", list(GREEDY))
def test_greedy_continuations_equal_hf_generate(variant):
    model, hf = GREEDY[variant]()
    check_greedy(model, hf, PROMPTS, PAD, EOS, variant)


def test_greedy_stops_at_eos_like_hf():
    """A model that says EOS early: both stop there (EOS kept, nothing after it)."""
    hf = tiny_llama(5)
    with torch.no_grad():
        hf.lm_head.weight[EOS] = hf.model.norm.weight.sign() * 0.5  # EOS scores high everywhere
    model = from_llama(hf)
    ours, theirs = ours_greedy(model, PROMPTS), hf_greedy(hf, PROMPTS, PAD, EOS)
    assert ours == theirs
    assert any(row and row[-1] == EOS and len(row) < NEW for row in ours)


# ---- what one side cannot express -------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope scaling"),
    (dict(attention_bias=True, mlp_bias=False), "attention_bias"),
    (dict(mlp_bias=True), "attention_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(head_dim=16), "head_dim"),
])
def test_import_refuses_what_our_model_cannot_express(overrides, match):
    with pytest.raises(ValueError, match=match):
        from_llama(LlamaForCausalLM(llama_config(**overrides)))


def test_import_refuses_other_models():
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        from_llama(tiny_ours())


@pytest.mark.parametrize("overrides, match", [
    (dict(norm="layer"), "RMSNorm"),
    (dict(positions="learned"), "rotary"),
    (dict(ffn_activation="gelu"), "SwiGLU"),
    (dict(norm_first=False, final_norm=False), "pre-norm"),
    (dict(embed_scale=True), "scale"),
    (dict(output_bias=True), "bias"),
])
def test_export_refuses_what_hf_llama_cannot_express(overrides, match):
    with pytest.raises(ValueError, match=match):
        to_llama(tiny_ours(**overrides))


def test_pad_id_without_a_pad_token():
    """No pad_token_id: the smallest id that is neither BOS nor EOS, or the one asked for."""
    hf = tiny_llama(pad_token_id=None)
    assert from_llama(hf).cfg.pad_id == 0
    assert from_llama(hf, pad_id=7).cfg.pad_id == 7
    with pytest.raises(ValueError, match="differ"):
        from_llama(hf, pad_id=EOS)
