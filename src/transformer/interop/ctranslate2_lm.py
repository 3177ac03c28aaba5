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

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from ..model.lm import LanguageModel
from .ctranslate2 import QUANTIZATIONS

if TYPE_CHECKING:  # pragma: no cover
    from ctranslate2.specs import TransformerDecoderModelSpec


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"to_ctranslate2_lm: {msg}")


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def _linear(spec, *layers: nn.Linear) -> None:
    """Fill a LinearSpec with one Linear, or several fused along the output axis."""
    spec.weight = np.concatenate([_np(m.weight) for m in layers], axis=0)
    if layers[0].bias is not None:
        spec.bias = np.concatenate([_np(m.bias) for m in layers], axis=0)


def _norm(spec, norm: nn.Module) -> None:
    spec.gamma = _np(norm.weight)
    if isinstance(norm, nn.LayerNorm):  # RMSNorm specs have no beta
        spec.beta = _np(norm.bias) if norm.bias is not None else np.zeros_like(spec.gamma)


def _activation(name: str):
    from ctranslate2.specs import common_spec

    act = common_spec.Activation
    return {"relu": act.RELU, "gelu": act.GELU, "gelu_tanh": act.GELUTanh, "silu": act.SWISH,
            "swiglu": act.SWISH}[name]


@torch.no_grad()
def to_ctranslate2_lm_spec(model: LanguageModel, vocab: list[str]) -> "TransformerDecoderModelSpec":
    """A validated ``ctranslate2.specs.TransformerDecoderModelSpec`` computing what
    ``model`` computes. ``vocab``: one distinct string per id, in id order."""
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
        att = layer.self_attn
        _norm(ls.self_attention.layer_norm, layer.self_block.norm)
        _linear(ls.self_attention.linear[0], att.q_proj, att.k_proj, att.v_proj)
        _linear(ls.self_attention.linear[1], att.out_proj)
        ffn = layer.ffn
        _norm(ls.ffn.layer_norm, layer.ffn_block.norm)
        if ffn.gate is not None:  # swiglu: CT2 computes act(linear_0 x) * linear_0_noact x
            _linear(ls.ffn.linear_0, ffn.gate)
            _linear(ls.ffn.linear_0_noact, ffn.fc1)
        else:
            _linear(ls.ffn.linear_0, ffn.fc1)
        _linear(ls.ffn.linear_1, ffn.fc2)
    weight, bias = model.output_layer()
    dec.projection.weight = _np(weight)  # tied: equal arrays are stored once
    if bias is not None:
        dec.projection.bias = _np(bias)

    c = spec.config
    c.bos_token = vocab[cfg.bos_id]
    c.eos_token = vocab[cfg.eos_id]
    c.unk_token = "<unk>" if "<unk>" in vocab else vocab[cfg.pad_id]
    c.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.register_vocabulary(list(vocab))
    spec.validate()
    return spec


def save_ctranslate2_lm(model: LanguageModel, out_dir: str | Path, vocab: list[str],
                        quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory for ``ctranslate2.Generator`` (``model.bin``,
    ``config.json``, ``vocabulary.json``). ``out_dir`` must not exist or be empty;
    ``quantization`` is one of :data:`~transformer.interop.ctranslate2.QUANTIZATIONS` or
    None (float32). Returns the directory."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    spec = to_ctranslate2_lm_spec(model, vocab)
    spec.optimize(quantization=quantization)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise ValueError(f"{out_dir}: not empty")
    spec.save(str(out_dir))
    return out_dir
