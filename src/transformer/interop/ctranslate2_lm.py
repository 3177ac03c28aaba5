"""Export of the decoder-only language model to CTranslate2's ``Generator``, built directly
from our weights with ``ctranslate2.specs.TransformerDecoderModelSpec`` (what CTranslate2's
own Llama and GPT-2 converters build).

    decoder.embeddings                     <- embed (scaled by sqrt(d_model) when embed_scale)
    decoder.position_encodings.encodings   <- the learned table, or our sinusoid table (none: rotary)
    self_attention.linear[0] / linear[1]   <- [q_proj; k_proj; v_proj] fused / out_proj
    ffn.linear_0 / linear_1 (/ linear_0_noact) <- fc1 / fc2 (swiglu: gate / fc2 / fc1)
    *.layer_norm, decoder.layer_norm       <- each sub-layer's norm, the final norm
    decoder.projection                     <- out_proj (or the tied embedding)

Rotary positions are CTranslate2's non-interleaved ("rotate half") rotation over the whole
head (``rotary_dim=0, rotary_interleave=False``) with our ``rope_theta``: the layout of
:mod:`~transformer.model.rotary`, so q_proj / k_proj are written as they are.

Use::

    save_ctranslate2_lm(model, "ct2", vocab)
    gen = ctranslate2.Generator("ct2")
    gen.generate_batch([[vocab[i] for i in prompt]], max_length=N, sampling_topk=1,
                       include_prompt_in_result=False)

CTranslate2 takes tokens as strings (``vocab[i]`` for id ``i``) and does not add BOS to
the prompt; it stops on the string of ``eos_id`` (``end_token`` to change that; the end
token is left out of the result unless ``return_end_token=True``). A batch of prompts of
different lengths is handled by CTranslate2 itself (no PAD is fed to it).

Refused (ValueError): a post-norm model with a final norm (CTranslate2 has a final norm
only in pre-norm models), and a vocabulary that is not one distinct string per id.
Everything else the model's config offers exports: pre- or post-norm, LayerNorm with or
without biases or RMSNorm, learned / sinusoidal / rotary positions, scaled embeddings,
relu / gelu / gelu_tanh / silu / swiglu, grouped-query attention, a tied or untied head and
an output bias.

``ctranslate2`` is an optional dependency (the ``export`` extra), imported inside the functions.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..extras import require
from ..model.lm import LanguageModel
from .ctranslate2 import _activation, _ffn, _norm, _np, _projection, _save_spec, _self_attention, _tokens
from .ctranslate2 import _check as _check_ct2

if TYPE_CHECKING:  # pragma: no cover
    from ctranslate2.specs import TransformerDecoderModelSpec


_check = partial(_check_ct2, where="to_ctranslate2_lm")


@torch.no_grad()
def to_ctranslate2_lm_spec(model: LanguageModel, vocab: list[str]) -> "TransformerDecoderModelSpec":
    """A validated ``ctranslate2.specs.TransformerDecoderModelSpec`` computing what
    ``model`` computes. ``vocab``: one distinct string per id, in id order."""
    require("ctranslate2", "export", __name__)
    from ctranslate2.specs import transformer_spec

    _check(isinstance(model, LanguageModel), f"expected a LanguageModel, got {type(model).__name__}")
    cfg = model.cfg
    _check(not (cfg.use_final_norm and not cfg.norm_first),
           "CTranslate2 has a final norm only in pre-norm models; this post-norm model has one")
    _check(len(vocab) == cfg.vocab_size, f"{len(vocab)} vocabulary entries, but the model has {cfg.vocab_size} ids")
    _check(len(set(vocab)) == len(vocab), "the vocabulary has duplicate entries")

    rope = cfg.positions == "rope"
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        cfg.n_layers, cfg.n_heads,
        pre_norm=cfg.norm_first,
        activation=_activation(cfg.ffn_activation),
        no_final_norm=not cfg.use_final_norm,
        ffn_glu=cfg.ffn_activation == "swiglu",
        rms_norm=cfg.norm == "rms",
        rotary_dim=0 if rope else None,  # 0: the whole head
        rotary_interleave=False,  # "rotate half", as ours and HF's
        rotary_base=float(cfg.rope_theta),
        num_heads_kv=None if cfg.kv_heads == cfg.n_heads else cfg.kv_heads,
    )
    dec = spec.decoder
    dec.embeddings.weight = _np(model.embed.weight)
    dec.scale_embeddings = bool(cfg.embed_scale)
    if not rope:
        table = model.positions.weight if cfg.positions == "learned" else model.positions.pe
        dec.position_encodings.encodings = _np(table)
    if model.decoder.norm is not None:
        _norm(dec.layer_norm, model.decoder.norm)
    for ls, layer in zip(dec.layer, model.decoder.layers):
        _self_attention(ls.self_attention, layer.self_block, layer.self_attn)
        _ffn(ls.ffn, layer.ffn_block, layer.ffn)
    _projection(dec.projection, model)
    _tokens(spec.config, cfg, vocab)
    spec.register_vocabulary(list(vocab))
    spec.validate()
    return spec


def save_ctranslate2_lm(model: LanguageModel, out_dir: str | Path, vocab: list[str],
                        quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory for ``ctranslate2.Generator`` (``model.bin``,
    ``config.json``, ``vocabulary.json``). ``out_dir`` must not exist or be empty;
    ``quantization`` is one of :data:`~transformer.interop.ctranslate2.QUANTIZATIONS` or
    None (float32). Returns the directory."""
    return _save_spec(lambda: to_ctranslate2_lm_spec(model, vocab), out_dir, quantization)
