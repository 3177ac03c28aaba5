"""Hugging Face Llama (``LlamaForCausalLM``) import and export for the decoder-only
:class:`~transformer.model.lm.LanguageModel`.

HF's Llama is our ``kind="decoder-only"`` model with: pre-norm RMSNorm (eps
``rms_norm_eps``) before each sub-layer and after the stack, rotary positions in the
"rotate half" layout (``rope_theta``; our :mod:`~transformer.model.rotary` uses the same
layout, so no permutation of q_proj / k_proj is needed), the gated SwiGLU feed-forward,
grouped-query attention (``num_key_value_heads``), unscaled embeddings and, usually, no
biases and an untied ``lm_head``.

Name map (ours <- HF, HF names under ``model.``; written once in :mod:`.hf_lm`):
    embed                                  <- embed_tokens
    out_proj (absent when tied)            <- lm_head (outside ``model.``)
    decoder.layers[i].self_block.norm      <- layers[i].input_layernorm
    decoder.layers[i].self_attn.{q,k,v}_proj <- layers[i].self_attn.{q,k,v}_proj
    decoder.layers[i].self_attn.out_proj   <- layers[i].self_attn.o_proj
    decoder.layers[i].ffn_block.norm       <- layers[i].post_attention_layernorm
    decoder.layers[i].ffn.gate / fc1 / fc2 <- layers[i].mlp.gate_proj / up_proj / down_proj
    decoder.norm                           <- norm

Token ids. Our model marks padding by the id ``pad_id``: every occurrence of it in the
input is padding (masked as a key, no position), and :func:`~transformer.decode.generate`
left-pads batches with it. HF marks padding with ``attention_mask`` instead, and Llama
configs often have no ``pad_token_id``. The import takes ``bos_id`` / ``eos_id`` from the
config (the first id when ``eos_token_id`` is a list) and ``pad_id`` from, in order: the
``pad_id`` argument, ``pad_token_id`` when set and different from EOS, else the smallest id
that is neither EOS nor BOS (0 for the usual Llama ids bos 1 / eos 2, which is ``<unk>`` in
Llama's sentencepiece vocabularies). Whatever id it is, input containing it is read as
padding: choose one the prompts never contain.

Mistral and Qwen2 are the same model under the same names (:mod:`.hf_lm`); Qwen2 has
biases on q_proj, k_proj and v_proj only (our ``qkv_bias``). Llama 3's ``rope_type: llama3``
frequency scaling becomes our ``rope_scaling``.

Not expressible in our model (ValueError): other rope scaling types, a head_dim other
than hidden_size / num_attention_heads, attention biases without MLP biases or the reverse
(our ``bias`` switches both), an MLP activation other than silu, ``pretraining_tp`` > 1,
a sliding attention window shorter than the context. Dropout: ``attention_dropout`` becomes ``attn_dropout``;
Llama has no residual dropout (ours is set to 0).

``transformers`` is imported inside the functions: it is an optional dependency.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..model.config import ModelConfig
from ..extras import require
from ..model.lm import LanguageModel
from ._hf import check as _check
from ._hf import LM_SHAPE, check_lm_export, hf_special_ids, new_hf_lm, same_head, special_ids
from .hf_lm import LLAMA_SHAPED, model_from_state, state_to_hf

if TYPE_CHECKING:  # pragma: no cover
    from transformers import LlamaConfig, LlamaForCausalLM


# our config's name -> LlamaConfig's, for the sizes that are the same number in both
_NAMES = {"vocab_size": "vocab_size", "d_model": "hidden_size", "d_ff": "intermediate_size",
          "n_layers": "num_hidden_layers", "max_len": "max_position_embeddings"}


def _rope(c, where: str) -> tuple[float, dict[str, float] | None]:
    """``rope_theta`` and our ``rope_scaling`` (None, or Llama 3's four numbers)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    _check(rope_type in ("default", "llama3"), where,
           f"rope scaling {rope_type!r} (rope_type) is not supported: only the default rotary positions "
           "and llama3 scaling")
    theta = params.get("rope_theta", getattr(c, "rope_theta", None))
    theta = 10000.0 if theta is None else float(theta)
    if rope_type == "default":
        return theta, None
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if params.get(k) is None]
    _check(not missing, where, f"llama3 rope scaling without {', '.join(missing)}")
    return theta, {k: float(params[k]) for k in keys}


def _sliding_window(c, where: str) -> None:
    """Mistral and Qwen2 may attend over a window of recent positions only: refused when
    the window is shorter than the context (our attention sees every earlier position)."""
    window = getattr(c, "sliding_window", None)
    used = getattr(c, "use_sliding_window", True)  # Qwen2 has the switch; Mistral uses any window it has
    _check(not used or window is None or window >= c.max_position_embeddings, where,
           f"sliding_window={window} (shorter than max_position_embeddings={c.max_position_embeddings}) "
           "is not supported: our attention sees every earlier position")


# ---- the config ---------------------------------------------------------------------------
def config_from_llama(hf_config: "LlamaConfig", tie_embeddings: bool, pad_id: int | None = None) -> ModelConfig:
    """Our ModelConfig for a LlamaConfig (or Mistral's, Qwen2's: the same shape); ValueError
    for what our model cannot express."""
    c, where = hf_config, "from_llama"
    family = getattr(c, "model_type", "llama")
    _check(family in LLAMA_SHAPED, where, f"model_type {family!r} is not Llama-shaped")
    n_heads = c.num_attention_heads
    kv = c.num_key_value_heads if getattr(c, "num_key_value_heads", None) is not None else n_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // n_heads
    _check(c.hidden_size % n_heads == 0 and head_dim == c.hidden_size // n_heads, where,
           f"head_dim {head_dim} != hidden_size / num_attention_heads "
           f"({c.hidden_size} / {n_heads}); our heads are d_model / n_heads wide")
    attention_bias = family == "qwen2" or bool(getattr(c, "attention_bias", False))
    mlp_bias = bool(getattr(c, "mlp_bias", False))
    _check(family == "qwen2" or attention_bias == mlp_bias, where,
           f"attention_bias={attention_bias} but mlp_bias={mlp_bias}: our model has biases in both "
           "attention and feed-forward, or in neither")
    _check(not (family == "qwen2" and mlp_bias), where, "mlp_bias on a Qwen2 model is not supported")
    _sliding_window(c, where)
    theta, scaling = _rope(c, where)
    _check(c.hidden_act == "silu", where,
           f"hidden_act {c.hidden_act!r} is not supported: our gated feed-forward is SwiGLU (silu)")
    _check((getattr(c, "pretraining_tp", 1) or 1) == 1, where, "pretraining_tp > 1 is not supported")
    return ModelConfig(
        **{ours: getattr(c, theirs) for ours, theirs in _NAMES.items()},
        n_heads=n_heads, n_kv_heads=None if kv == n_heads else kv, dropout=0.0,
        attn_dropout=float(getattr(c, "attention_dropout", 0.0) or 0.0), tie_embeddings=tie_embeddings,
        ffn_activation="swiglu", norm="rms", bias=mlp_bias, qkv_bias=family == "qwen2", positions="rope",
        rope_theta=theta, rope_scaling=scaling, layer_norm_eps=float(c.rms_norm_eps),
        **special_ids(c, c.vocab_size, where, pad_id), **LM_SHAPE,
    )


def config_to_llama(cfg: ModelConfig) -> "LlamaConfig":
    """The LlamaConfig for one of our configs; ValueError when HF Llama cannot express it."""
    require("transformers", "interop", __name__)
    from transformers import LlamaConfig

    where = "to_llama"
    check_lm_export(cfg, where, "HF Llama", norm="rms")
    _check(cfg.positions == "rope", where,
           f"HF Llama uses rotary positions: needs positions='rope', the model has {cfg.positions!r}")
    _check(cfg.ffn_activation == "swiglu", where,
           f"HF Llama's feed-forward is SwiGLU: needs ffn_activation='swiglu', the model has {cfg.ffn_activation!r}")
    _check(not cfg.qkv_bias or cfg.bias, where, "HF Llama has no biases on q/k/v alone (qkv_bias: that is Qwen2)")
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if cfg.rope_scaling is not None:
        rope.update(rope_type="llama3", **cfg.rope_scaling)
    return LlamaConfig(
        **{theirs: getattr(cfg, ours) for ours, theirs in _NAMES.items()},
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.d_head, hidden_act="silu",
        rms_norm_eps=cfg.layer_norm_eps, rope_parameters=rope, attention_bias=cfg.bias, mlp_bias=cfg.bias,
        attention_dropout=cfg.attn_dropout, tie_word_embeddings=cfg.tie_embeddings, **hf_special_ids(cfg),
    )


# ---- import ---------------------------------------------------------------------------------
@torch.no_grad()
def from_llama(hf_model: "LlamaForCausalLM", pad_id: int | None = None) -> LanguageModel:
    """Build our LanguageModel from a ``transformers.LlamaForCausalLM``, copying every weight.

    The result computes the same logits as ``hf_model(input_ids, attention_mask,
    position_ids)`` where ``attention_mask = input_ids != pad_id`` and ``position_ids`` count
    each row's real tokens (what HF's ``generate`` derives from the mask). The head is tied
    when ``lm_head`` and ``embed_tokens`` hold the same values. Takes the HF model's dtype,
    device and train/eval mode. ``pad_id``: the id to treat as padding (module docstring).

    Raises:
        ValueError: for what our model cannot express (rope scaling other than llama3, a different head_dim,
            attention biases without MLP biases or the reverse, another MLP activation).
    """
    require("transformers", "interop", __name__)
    from transformers import PreTrainedModel

    where = "from_llama"
    family = getattr(getattr(hf_model, "config", None), "model_type", None)
    _check(isinstance(hf_model, PreTrainedModel) and family in LLAMA_SHAPED and hasattr(hf_model, "lm_head"), where,
           f"expected a transformers.LlamaForCausalLM (or Mistral's, Qwen2's), got {type(hf_model).__name__}")
    tie = same_head(hf_model.model.embed_tokens.weight, hf_model.lm_head.weight)
    cfg = config_from_llama(hf_model.config, tie, pad_id)
    model = model_from_state(cfg, family, hf_model.state_dict(), where)
    model.train(hf_model.training)
    return model


# ---- export ---------------------------------------------------------------------------------
@torch.no_grad()
def to_llama(model: LanguageModel) -> "LlamaForCausalLM":
    """A ``transformers.LlamaForCausalLM`` computing the same logits as ``model``.

    The model needs what HF Llama has: decoder-only, pre-norm RMSNorm with a final norm,
    rotary positions, SwiGLU, unscaled embeddings, no output bias (ValueError otherwise).
    Biases (``bias=True``) become ``attention_bias`` and ``mlp_bias``. The config carries
    ``pad_id`` / ``bos_id`` / ``eos_id`` as ``pad_token_id`` / ``bos_token_id`` /
    ``eos_token_id``. Takes the model's dtype, device and train/eval mode.
    """
    require("transformers", "interop", __name__)
    from transformers import LlamaForCausalLM

    where = "to_llama"
    hf = new_hf_lm(model, LlamaForCausalLM, config_to_llama, where)
    state_to_hf(model, "llama", hf.state_dict(), where)
    if model.out_proj is None:
        _check(hf.lm_head.weight is hf.model.embed_tokens.weight, where, "HF did not tie lm_head to embed_tokens")
    hf.train(model.training)
    return hf
