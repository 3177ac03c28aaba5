"""Hugging Face Llama (``LlamaForCausalLM``) import and export for the decoder-only
:class:`~transformer.model.lm.LanguageModel`.

HF's Llama is our ``kind="decoder-only"`` model with: pre-norm RMSNorm (eps
``rms_norm_eps``) before each sub-layer and after the stack, rotary positions in the
"rotate half" layout (``rope_theta``; our :mod:`~transformer.model.rotary` uses the same
layout, so no permutation of q_proj / k_proj is needed), the gated SwiGLU feed-forward,
grouped-query attention (``num_key_value_heads``), unscaled embeddings and, usually, no
biases and an untied ``lm_head``.

Name map (ours <- HF, HF names under ``model.``):
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

Not expressible in our model (ValueError): rope scaling (any ``rope_type`` but
"default"), a head_dim other than hidden_size / num_attention_heads, attention biases
without MLP biases or the reverse (our ``bias`` switches both), an MLP activation other
than silu, ``pretraining_tp`` > 1. Dropout: ``attention_dropout`` becomes ``attn_dropout``;
Llama has no residual dropout (ours is set to 0).

``transformers`` is imported inside the functions: it is an optional dependency.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..extras import require
from ..model.lm import LanguageModel
from ._hf import check as _check
from ._hf import LM_SHAPE, check_lm_export, copy_, hf_special_ids, new_hf_lm, same_head, special_ids

if TYPE_CHECKING:  # pragma: no cover
    from transformers import LlamaConfig, LlamaForCausalLM


def _rope_theta(c: "LlamaConfig", where: str) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    _check(rope_type == "default", where,
           f"rope scaling ({rope_type!r}) is not supported: our rotary positions are unscaled")
    legacy = getattr(c, "rope_scaling", None)
    _check(not legacy or legacy.get("rope_type", legacy.get("type", "default")) == "default", where,
           f"rope_scaling {legacy} is not supported: our rotary positions are unscaled")
    theta = params.get("rope_theta", getattr(c, "rope_theta", None))
    return 10000.0 if theta is None else float(theta)


# ---- the config ---------------------------------------------------------------------------
def config_from_llama(hf_config: "LlamaConfig", tie_embeddings: bool, pad_id: int | None = None) -> ModelConfig:
    """Our ModelConfig for a LlamaConfig; ValueError for what our model cannot express."""
    c, where = hf_config, "from_llama"
    n_heads = c.num_attention_heads
    kv = c.num_key_value_heads if c.num_key_value_heads is not None else n_heads
    _check(c.hidden_size % n_heads == 0 and c.head_dim == c.hidden_size // n_heads, where,
           f"head_dim {c.head_dim} != hidden_size / num_attention_heads "
           f"({c.hidden_size} / {n_heads}); our heads are d_model / n_heads wide")
    _check(bool(c.attention_bias) == bool(c.mlp_bias), where,
           f"attention_bias={c.attention_bias} but mlp_bias={c.mlp_bias}: our model has biases in both "
           "attention and feed-forward, or in neither")
    _check(c.hidden_act == "silu", where,
           f"hidden_act {c.hidden_act!r} is not supported: our gated feed-forward is SwiGLU (silu)")
    _check((getattr(c, "pretraining_tp", 1) or 1) == 1, where, "pretraining_tp > 1 is not supported")
    return ModelConfig(
        vocab_size=c.vocab_size,
        d_model=c.hidden_size,
        n_heads=n_heads,
        n_kv_heads=None if kv == n_heads else kv,
        d_ff=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        dropout=0.0,
        attn_dropout=float(c.attention_dropout),
        max_len=c.max_position_embeddings,
        tie_embeddings=tie_embeddings,
        ffn_activation="swiglu",
        norm="rms",
        bias=bool(c.attention_bias),
        positions="rope",
        rope_theta=_rope_theta(c, where),
        layer_norm_eps=float(c.rms_norm_eps),
        **special_ids(c, c.vocab_size, where, pad_id),
        **LM_SHAPE,
    )


def config_to_llama(cfg: ModelConfig) -> "LlamaConfig":
    """The LlamaConfig for one of our configs; ValueError when HF Llama cannot express it."""
    require("transformers", "interop", __name__)
    from transformers import LlamaConfig

    where = "to_llama"
    check_lm_export(cfg, where, "HF Llama")
    _check(cfg.norm == "rms", where, f"HF Llama uses RMSNorm: needs norm='rms', the model has {cfg.norm!r}")
    _check(cfg.positions == "rope", where,
           f"HF Llama uses rotary positions: needs positions='rope', the model has {cfg.positions!r}")
    _check(cfg.ffn_activation == "swiglu", where,
           f"HF Llama's feed-forward is SwiGLU: needs ffn_activation='swiglu', the model has {cfg.ffn_activation!r}")
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_head,
        hidden_act="silu",
        max_position_embeddings=cfg.max_len,
        rms_norm_eps=cfg.layer_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        attention_bias=cfg.bias,
        mlp_bias=cfg.bias,
        attention_dropout=cfg.attn_dropout,
        tie_word_embeddings=cfg.tie_embeddings,
        **hf_special_ids(cfg),
    )


# ---- the weights --------------------------------------------------------------------------
def _module_pairs(model: LanguageModel, hf: "LlamaForCausalLM") -> Iterator[tuple[str, nn.Module, nn.Module]]:
    """(our name, our module, HF module) for every Linear and norm of the stack."""
    for i, (ours, theirs) in enumerate(zip(model.decoder.layers, hf.model.layers)):
        name = f"decoder.layers.{i}"
        a, b = ours.self_attn, theirs.self_attn
        yield f"{name}.self_block.norm", ours.self_block.norm, theirs.input_layernorm
        yield f"{name}.self_attn.q_proj", a.q_proj, b.q_proj
        yield f"{name}.self_attn.k_proj", a.k_proj, b.k_proj
        yield f"{name}.self_attn.v_proj", a.v_proj, b.v_proj
        yield f"{name}.self_attn.out_proj", a.out_proj, b.o_proj
        yield f"{name}.ffn_block.norm", ours.ffn_block.norm, theirs.post_attention_layernorm
        yield f"{name}.ffn.gate", ours.ffn.gate, theirs.mlp.gate_proj
        yield f"{name}.ffn.fc1", ours.ffn.fc1, theirs.mlp.up_proj
        yield f"{name}.ffn.fc2", ours.ffn.fc2, theirs.mlp.down_proj
    yield "decoder.norm", model.decoder.norm, hf.model.norm


def _tensor_pairs(model: LanguageModel, hf: "LlamaForCausalLM") -> Iterator[tuple[str, Tensor, Tensor]]:
    yield "embed.weight", model.embed.weight, hf.model.embed_tokens.weight
    if model.out_proj is not None:
        yield "out_proj.weight", model.out_proj.weight, hf.lm_head.weight
    for name, ours, theirs in _module_pairs(model, hf):
        yield f"{name}.weight", ours.weight, theirs.weight
        if getattr(ours, "bias", None) is not None or getattr(theirs, "bias", None) is not None:
            _check(ours.bias is not None and theirs.bias is not None, "llama interop", f"{name}: one side has no bias")
            yield f"{name}.bias", ours.bias, theirs.bias


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
        ValueError: for what our model cannot express (rope scaling, a different head_dim,
            attention biases without MLP biases or the reverse, another MLP activation).
    """
    require("transformers", "interop", __name__)
    from transformers import LlamaForCausalLM

    where = "from_llama"
    _check(isinstance(hf_model, LlamaForCausalLM), where,
           f"expected a transformers.LlamaForCausalLM, got {type(hf_model).__name__}")
    embed = hf_model.model.embed_tokens.weight
    tie = same_head(embed, hf_model.lm_head.weight)
    cfg = config_from_llama(hf_model.config, tie, pad_id)
    model = LanguageModel(cfg).to(device=embed.device, dtype=embed.dtype)
    for name, ours, theirs in _tensor_pairs(model, hf_model):
        copy_(ours, theirs, name, where)
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
    for name, ours, theirs in _tensor_pairs(model, hf):
        copy_(theirs, ours, name, where)
    if model.out_proj is None:
        _check(hf.lm_head.weight is hf.model.embed_tokens.weight, where, "HF did not tie lm_head to embed_tokens")
    hf.train(model.training)
    return hf
