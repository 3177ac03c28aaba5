"""Hugging Face GPT-2 (``GPT2LMHeadModel``) import and export for the decoder-only
:class:`~transformer.model.lm.LanguageModel`.

HF's GPT-2 is our ``kind="decoder-only"`` model with: pre-norm LayerNorm (eps
``layer_norm_epsilon``, with biases) before each sub-layer and after the stack, learned
positions (``wpe``, ``n_positions`` of them), unscaled embeddings, biases everywhere, a
two-matrix feed-forward (``activation_function``: "gelu_new" is our "gelu_tanh") and the
head tied to ``wte`` (an untied ``lm_head`` is kept as our ``out_proj``).

GPT-2 stores its linear layers as ``Conv1D``: the weight is (in, out), the transpose of
``nn.Linear``'s (out, in). ``c_attn`` holds W_Q, W_K, W_V side by side along its output axis.

Name map (ours <- HF, HF names under ``transformer.``; the import's in :mod:`.hf_lm`):
    embed / positions                      <- wte / wpe
    out_proj (absent when tied)            <- lm_head (outside ``transformer.``)
    decoder.layers[i].self_block.norm      <- h[i].ln_1
    decoder.layers[i].self_attn.{q,k,v}_proj <- h[i].attn.c_attn (thirds of the columns, transposed)
    decoder.layers[i].self_attn.out_proj   <- h[i].attn.c_proj (transposed)
    decoder.layers[i].ffn_block.norm       <- h[i].ln_2
    decoder.layers[i].ffn.fc1 / fc2        <- h[i].mlp.c_fc / c_proj (transposed)
    decoder.norm                           <- ln_f

Token ids. GPT-2 has no padding token (``pad_token_id`` None) and one id, 50256, for
both BOS and EOS. Our model marks padding by the id ``pad_id`` (every occurrence of it
in the input is padding; :func:`~transformer.decode.generate` left-pads with it), so the
import takes ``bos_id`` / ``eos_id`` from the config and ``pad_id`` from: the ``pad_id``
argument, ``pad_token_id`` when set and different from EOS, else 0 (see
:func:`~transformer.interop._hf.special_ids`). In GPT-2's own vocabulary id 0 is "!",
a real token: input containing it would be read as padding. Pass ``pad_id=`` an id the
prompts never contain when that matters.

Export: a model without biases (``bias=False``, e.g. nanoGPT's shape) is exported with
zero biases, and a model with sinusoidal positions with its sinusoid table as ``wpe``;
both compute exactly what the model computes. Not expressible (ValueError): post-norm,
RMSNorm, rotary positions, SwiGLU, grouped-query attention, scaled embeddings, an output
bias. Import refuses ``scale_attn_weights=False``, ``scale_attn_by_inverse_layer_idx``,
cross-attention and activations we do not have. Dropout: ``resid_pdrop`` becomes our
``dropout`` (which also applies to the embeddings, GPT-2's ``embd_pdrop``),
``attn_pdrop`` our ``attn_dropout``.

``transformers`` is imported inside the functions: it is an optional dependency.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..model.config import ModelConfig
from ..extras import require
from ..model.lm import LanguageModel
from ._hf import check as _check
from ._hf import LM_SHAPE, check_lm_export, copy_, hf_special_ids, new_hf_lm, same_head, special_ids
from .hf_lm import model_from_state

if TYPE_CHECKING:  # pragma: no cover
    from transformers import GPT2Config, GPT2LMHeadModel

# HF's name for an activation -> ours
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu"}
_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
# our config's name -> GPT2Config's, for the sizes that are the same number in both
_NAMES = {"vocab_size": "vocab_size", "d_model": "n_embd", "n_heads": "n_head", "n_layers": "n_layer",
          "max_len": "n_positions", "layer_norm_eps": "layer_norm_epsilon"}


# ---- the config ---------------------------------------------------------------------------
def config_from_gpt2(hf_config: "GPT2Config", tie_embeddings: bool, pad_id: int | None = None) -> ModelConfig:
    """Our ModelConfig for a GPT2Config; ValueError for what our model cannot express."""
    c, where = hf_config, "from_gpt2"
    _check(c.activation_function in _ACTIVATIONS, where,
           f"activation_function {c.activation_function!r} is not supported; use one of {sorted(_ACTIVATIONS)}")
    _check(bool(c.scale_attn_weights), where,
           "scale_attn_weights=False is not supported: our attention always divides by sqrt(d_head)")
    _check(not c.scale_attn_by_inverse_layer_idx, where, "scale_attn_by_inverse_layer_idx is not supported")
    _check(not c.add_cross_attention, where, "cross-attention (add_cross_attention) is not supported")
    return ModelConfig(
        **{ours: getattr(c, theirs) for ours, theirs in _NAMES.items()},
        d_ff=c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        dropout=float(c.resid_pdrop), attn_dropout=float(c.attn_pdrop), tie_embeddings=tie_embeddings,
        ffn_activation=_ACTIVATIONS[c.activation_function], norm="layer", bias=True, positions="learned",
        **special_ids(c, c.vocab_size, where, pad_id), **LM_SHAPE,
    )


def config_to_gpt2(cfg: ModelConfig) -> "GPT2Config":
    """The GPT2Config for one of our configs; ValueError when HF GPT-2 cannot express it."""
    require("transformers", "interop", __name__)
    from transformers import GPT2Config

    where = "to_gpt2"
    check_lm_export(cfg, where, "HF GPT-2", norm="layer")
    _check(cfg.positions in ("learned", "sinusoidal"), where,
           f"HF GPT-2 adds a position table to the embeddings; positions={cfg.positions!r} cannot be expressed")
    _check(cfg.ffn_activation in _TO_HF, where,
           f"HF GPT-2 has a two-matrix feed-forward; ffn_activation={cfg.ffn_activation!r} cannot be expressed")
    _check(cfg.kv_heads == cfg.n_heads, where, "HF GPT-2 has no grouped-query attention: needs n_kv_heads=None")
    return GPT2Config(
        **{theirs: getattr(cfg, ours) for ours, theirs in _NAMES.items()},
        n_inner=cfg.d_ff, activation_function=_TO_HF[cfg.ffn_activation], resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.attn_dropout, tie_word_embeddings=cfg.tie_embeddings,
        **hf_special_ids(cfg),
    )


# ---- the weights --------------------------------------------------------------------------
def _norm_pairs(model: LanguageModel, hf: "GPT2LMHeadModel"):
    for i, (ours, theirs) in enumerate(zip(model.decoder.layers, hf.transformer.h)):
        yield f"decoder.layers.{i}.self_block.norm", ours.self_block.norm, theirs.ln_1
        yield f"decoder.layers.{i}.ffn_block.norm", ours.ffn_block.norm, theirs.ln_2
    yield "decoder.norm", model.decoder.norm, hf.transformer.ln_f


def _conv_pairs(model: LanguageModel, hf: "GPT2LMHeadModel"):
    """(name, [our Linears], HF Conv1D): the Linears side by side are the Conv1D's output."""
    for i, (ours, theirs) in enumerate(zip(model.decoder.layers, hf.transformer.h)):
        name, a = f"decoder.layers.{i}", ours.self_attn
        yield f"{name}.self_attn.{{q,k,v}}_proj", [a.q_proj, a.k_proj, a.v_proj], theirs.attn.c_attn
        yield f"{name}.self_attn.out_proj", [a.out_proj], theirs.attn.c_proj
        yield f"{name}.ffn.fc1", [ours.ffn.fc1], theirs.mlp.c_fc
        yield f"{name}.ffn.fc2", [ours.ffn.fc2], theirs.mlp.c_proj


def _is_gpt2(hf_model: object) -> bool:
    return isinstance(hf_model, require("transformers", "interop", __name__).GPT2LMHeadModel)


# ---- import ---------------------------------------------------------------------------------
@torch.no_grad()
def from_gpt2(hf_model: "GPT2LMHeadModel", pad_id: int | None = None) -> LanguageModel:
    """Build our LanguageModel from a ``transformers.GPT2LMHeadModel``, copying every weight.

    The result computes the same logits as ``hf_model(input_ids, attention_mask,
    position_ids)`` where ``attention_mask = input_ids != pad_id`` and ``position_ids`` count
    each row's real tokens (what HF's ``generate`` derives from the mask). The head is tied
    when ``lm_head`` and ``wte`` hold the same values. Takes the HF model's dtype, device and
    train/eval mode. ``pad_id``: the id to treat as padding (module docstring).
    """
    where = "from_gpt2"
    _check(_is_gpt2(hf_model), where, f"expected a transformers.GPT2LMHeadModel, got {type(hf_model).__name__}")
    tie = same_head(hf_model.transformer.wte.weight, hf_model.lm_head.weight)
    cfg = config_from_gpt2(hf_model.config, tie, pad_id)
    model = model_from_state(cfg, "gpt2", hf_model.state_dict(), where)
    model.train(hf_model.training)
    return model


# ---- export ---------------------------------------------------------------------------------
def _bias(module: nn.Module, n: int, like: Tensor) -> Tensor:
    b = getattr(module, "bias", None)
    return b if b is not None else like.new_zeros(n)


@torch.no_grad()
def to_gpt2(model: LanguageModel) -> "GPT2LMHeadModel":
    """A ``transformers.GPT2LMHeadModel`` computing the same logits as ``model``.

    The model needs what HF GPT-2 has: decoder-only, pre-norm LayerNorm with a final norm,
    learned (or sinusoidal, written as the learned table) positions, a two-matrix
    feed-forward, no grouped-query attention, unscaled embeddings, no output bias
    (ValueError otherwise). Missing biases are exported as zeros. The config carries
    ``pad_id`` / ``bos_id`` / ``eos_id``. Takes the model's dtype, device and train/eval mode.
    """
    require("transformers", "interop", __name__)
    from transformers import GPT2LMHeadModel

    where = "to_gpt2"
    hf = new_hf_lm(model, GPT2LMHeadModel, config_to_gpt2, where)
    t = hf.transformer
    copy_(t.wte.weight, model.embed.weight, "wte.weight", where)
    table = model.positions.weight if model.cfg.positions == "learned" else model.positions.pe
    copy_(t.wpe.weight, table, "wpe.weight", where)
    if model.out_proj is not None:
        copy_(hf.lm_head.weight, model.out_proj.weight, "lm_head.weight", where)
    else:
        _check(hf.lm_head.weight is t.wte.weight, where, "HF did not tie lm_head to wte")
    for name, ours, theirs in _norm_pairs(model, hf):
        copy_(theirs.weight, ours.weight, f"{name}.weight", where)
        copy_(theirs.bias, _bias(ours, ours.weight.numel(), ours.weight), f"{name}.bias", where)
    for name, linears, conv in _conv_pairs(model, hf):
        w = torch.cat([lin.weight for lin in linears], dim=0).t()
        b = torch.cat([_bias(lin, lin.out_features, lin.weight) for lin in linears])
        copy_(conv.weight, w, f"{name}.weight", where)
        copy_(conv.bias, b, f"{name}.bias", where)
    hf.train(model.training)
    return hf
