"""Hugging Face GPT-2 import/export: the same logits and the same greedy continuations as
``transformers.GPT2LMHeadModel``, on tiny randomly initialised models (no download).

GPT-2's ids: no pad token, one id (the last, as 50256 in GPT-2) for BOS and EOS. The
import then reads id 0 as padding (see ``transformer.interop.gpt2``): prompts never
contain it, and its output row is zeroed so that neither model generates it (more in
``lm_parity``, the helpers this file shares with the Llama parity tests).
"""
import pytest
import torch
from lm_parity import NEW, check_greedy, check_logits, check_same_weights, hf_greedy, ours_greedy, randomize
from transformers import GPT2Config, GPT2LMHeadModel

from transformer import ModelConfig
from transformer.interop import from_gpt2, to_gpt2
from transformer.interop.gpt2 import config_to_gpt2
from transformer.model.lm import LanguageModel

V, PAD = 89, 0
EOS = BOS = V - 1
PROMPTS = [[5, 17, 33, 8, 61, 12, 40], [9, 22], [71, 3, 3, 50, 18], [44], [13, 27, 80, 6, 30, 52, 7, 19, 64]]


def gpt2_config(**overrides) -> GPT2Config:
    kwargs = dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, bos_token_id=BOS, eos_token_id=EOS)
    return GPT2Config(**{**kwargs, **overrides})


def tiny_gpt2(seed: int = 0, **overrides) -> GPT2LMHeadModel:
    hf = GPT2LMHeadModel(gpt2_config(**overrides)).eval()
    randomize(hf, seed, PAD)
    return hf


def tiny_ours(seed: int = 0, **overrides) -> LanguageModel:
    cfg = ModelConfig.preset("gpt2-small", vocab_size=V, **{"max_len": 64, "d_model": 32, "n_heads": 4, "d_ff": 128,
                                                             "n_layers": 2, "dropout": 0.0, "bos_id": BOS,
                                                             "eos_id": EOS, **overrides})
    model = LanguageModel(cfg).eval()
    randomize(model, seed, PAD)
    return model


# ---- logits ---------------------------------------------------------------------------------
VARIANTS = {
    "tied-gelu_new": dict(),
    "untied-eps": dict(tie_word_embeddings=False, layer_norm_epsilon=1e-6),
    "tied-relu-inner": dict(activation_function="relu", n_inner=48),
    "tied-gelu": dict(activation_function="gelu"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_imported_model_gives_hf_logits(variant):
    hf = tiny_gpt2(**VARIANTS[variant])
    model = from_gpt2(hf)
    cfg = model.cfg
    assert not model.training
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (PAD, BOS, EOS)
    assert cfg.tie_embeddings == bool(hf.config.tie_word_embeddings) == (model.out_proj is None)
    assert cfg.positions == "learned" and cfg.norm == "layer" and cfg.bias
    check_logits(model, hf, PROMPTS, PAD, f"from_gpt2 {variant}")


def test_gelu_new_is_our_gelu_tanh():
    assert from_gpt2(tiny_gpt2()).cfg.ffn_activation == "gelu_tanh"


OURS = {
    "tied": dict(),
    "untied": dict(tie_embeddings=False),
    # nanoGPT's shape: no biases (exported as zeros), exact GELU
    "nanogpt-no-bias": dict(bias=False, ffn_activation="gelu"),
    # sinusoidal positions, exported as GPT-2's learned table
    "sinusoidal": dict(positions="sinusoidal"),
}


@pytest.mark.parametrize("variant", list(OURS))
def test_exported_model_gives_our_logits(variant):
    model = tiny_ours(**OURS[variant])
    hf = to_gpt2(model)
    assert not hf.training
    assert (hf.lm_head.weight is hf.transformer.wte.weight) == model.cfg.tie_embeddings
    check_logits(model, hf, PROMPTS, PAD, f"to_gpt2 {variant}")


def test_round_trip_keeps_every_weight():
    for tie in (True, False):
        hf = tiny_gpt2(tie_word_embeddings=tie)
        check_same_weights(hf, to_gpt2(from_gpt2(hf)))


def test_gpt2_small_preset_converts_to_the_same_parameter_count():
    cfg = ModelConfig.preset("gpt2-small", vocab_size=50257, pad_id=0, bos_id=50256, eos_id=50256)
    with torch.device("meta"):
        hf = GPT2LMHeadModel(config_to_gpt2(cfg))
        ours = LanguageModel(cfg)
    assert hf.num_parameters() == ours.num_parameters() == 124_439_808


# ---- greedy continuations ---------------------------------------------------------------------
GREEDY = {
    "import-tied": lambda: (from_gpt2(h := tiny_gpt2(1)), h),
    "import-untied": lambda: (from_gpt2(h := tiny_gpt2(2, tie_word_embeddings=False)), h),
    "export-tied": lambda: ((m := tiny_ours(3)), to_gpt2(m)),
    "export-untied": lambda: ((m := tiny_ours(4, tie_embeddings=False)), to_gpt2(m)),
}


@pytest.mark.parametrize("variant", list(GREEDY))
def test_greedy_continuations_equal_hf_generate(variant):
    model, hf = GREEDY[variant]()
    check_greedy(model, hf, PROMPTS, PAD, EOS, variant)


def test_greedy_stops_at_eos_like_hf():
    """EOS's output row made 1.05 x that of a token the model often picks (with a positive
    logit): the rows that would pick it stop with EOS instead, at varied lengths."""
    hf = tiny_gpt2(5, tie_word_embeddings=False)
    often = hf_greedy(hf, PROMPTS, PAD, EOS)[1][3]
    with torch.no_grad():
        hf.lm_head.weight[EOS] = 1.05 * hf.lm_head.weight[often]
    model = from_gpt2(hf)
    ours, theirs = ours_greedy(model, PROMPTS), hf_greedy(hf, PROMPTS, PAD, EOS)
    assert ours == theirs
    print(ours)
    assert any(row and row[-1] == EOS and len(row) < NEW for row in ours)


# ---- ids and what one side cannot express -----------------------------------------------------
def test_pad_id_choices():
    hf = tiny_gpt2()
    assert from_gpt2(hf).cfg.pad_id == 0  # no pad token: 0 (a real token in GPT-2's vocabulary)
    assert from_gpt2(hf, pad_id=5).cfg.pad_id == 5
    assert from_gpt2(tiny_gpt2(pad_token_id=7)).cfg.pad_id == 7
    assert from_gpt2(tiny_gpt2(pad_token_id=EOS)).cfg.pad_id == 0  # pad = eos (a common habit): not usable
    with pytest.raises(ValueError, match="differ"):
        from_gpt2(hf, pad_id=EOS)


@pytest.mark.parametrize("overrides, match", [
    (dict(scale_attn_weights=False), "scale_attn_weights"),
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    (dict(activation_function="quick_gelu"), "activation_function"),
])
def test_import_refuses_what_our_model_cannot_express(overrides, match):
    with pytest.raises(ValueError, match=match):
        from_gpt2(GPT2LMHeadModel(gpt2_config(**overrides)))


def test_import_refuses_other_models():
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        from_gpt2(tiny_ours())


@pytest.mark.parametrize("overrides, match", [
    (dict(positions="rope"), "positions='rope'"),
    (dict(norm="rms"), "LayerNorm"),
    (dict(ffn_activation="swiglu"), "two-matrix"),
    (dict(n_kv_heads=2), "grouped-query"),
    (dict(norm_first=False, final_norm=False), "pre-norm"),
    (dict(embed_scale=True), "scale"),
    (dict(output_bias=True), "bias"),
])
def test_export_refuses_what_hf_gpt2_cannot_express(overrides, match):
    with pytest.raises(ValueError, match=match):
        to_gpt2(tiny_ours(**overrides))


def test_export_refuses_the_encoder_decoder():
    from transformer import Transformer

    with pytest.raises(ValueError, match="LanguageModel"):
        to_gpt2(Transformer(ModelConfig.preset("toy", vocab_size=V)))
