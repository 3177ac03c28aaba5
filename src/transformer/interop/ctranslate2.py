"""Export to CTranslate2, built directly from our weights with ``ctranslate2.specs``: one
writer, two model specs. The translation model becomes a ``TransformerSpec`` for
``ctranslate2.Translator`` (:func:`save_ctranslate2`); the decoder-only language model a
``TransformerDecoderModelSpec`` for ``ctranslate2.Generator`` (:func:`save_ctranslate2_lm`),
what CTranslate2's own Llama and GPT-2 converters build.

CTranslate2 runs the same post-norm (or pre-norm) Transformer in C++, with its own beam
search and optional int8 weights. The spec is filled from our modules:

    encoder.embeddings[0] / decoder.embeddings  <- src_embed / tgt_embed, or a language model's
                                                   embed (scaled by sqrt(d_model) when ours is)
    */position_encodings.encodings              <- our sinusoid table, registered explicitly, or a
                                                   language model's learned table (none: rotary)
    decoder.projection (weight, bias)           <- out_proj (or the tied embedding), out_bias
    self_attention.linear[0] / linear[1]        <- [q_proj; k_proj; v_proj] fused / out_proj
    attention.linear[0] / [1] / [2]             <- cross_attn q_proj / [k_proj; v_proj] / out_proj
    ffn.linear_0 / linear_1 (/ linear_0_noact)  <- fc1 / fc2 (swiglu: gate / fc2 / fc1)
    *.layer_norm, */layer_norm                  <- each sub-layer's norm, the final norms

Positions. CTranslate2 builds its own sinusoid table ([sin | cos], our ``"concat"``)
only when a spec gives none. We register ours, so a model with the paper's interleaved
layout exports exactly, without a permutation, and positions past ``max_len`` are refused
there as here.

Tokens. The vocabulary is the subword pieces in id order: ``<pad>`` 0, ``<s>`` 1, ``</s>``
2, ``<unk>`` 3 for models trained here. The decoder starts from the piece of ``bos_id``,
stops on the piece of ``eos_id``, and EOS is appended to the source (``add_source_eos``),
as :class:`~transformer.inference.translator.Translator` does. Feed CTranslate2 the pieces of
``Subwords.pieces(text)``.

Decoding differences to know (see ``tests/export/test_export_ctranslate2.py``):
  * CTranslate2's ``length_penalty`` divides by ``len ** alpha`` (len without EOS); ours by
    GNMT's ``((5 + len) / 6) ** alpha`` (len with EOS). They agree at 0:
    ``length_penalty=0`` here is ``alpha=0`` in :func:`~transformer.decode.beam_search`.
  * At ``max_decoding_length`` CTranslate2 keeps the unfinished hypotheses; ours forces EOS.
  * Our searches never emit PAD or BOS: their log-probabilities are set to -inf after the
    softmax. CTranslate2's ``suppress_sequences=[["<pad>"], ["<s>"]]`` masks them before its
    softmax instead, which renormalises each step and can reorder close beam hypotheses;
    without it the searches agree token for token (a trained model does not pick PAD/BOS).
  * ``min_decoding_length=m`` there is ``min_length=m + 1`` here (ours counts EOS).

The language model. Rotary positions are CTranslate2's non-interleaved ("rotate half")
rotation over the whole head (``rotary_dim=0, rotary_interleave=False``) with our
``rope_theta``: the layout of :mod:`~transformer.model.rotary`, so q_proj / k_proj are
written as they are. Use::

    save_ctranslate2_lm(model, "ct2", vocab)
    gen = ctranslate2.Generator("ct2")
    gen.generate_batch([[vocab[i] for i in prompt]], max_length=N, sampling_topk=1,
                       include_prompt_in_result=False)

CTranslate2 takes tokens as strings (``vocab[i]`` for id ``i``) and does not add BOS to
the prompt; it stops on the string of ``eos_id`` (``end_token`` to change that; the end
token is left out of the result unless ``return_end_token=True``). A batch of prompts of
different lengths is handled by CTranslate2 itself (no PAD is fed to it). Everything the
model's config offers exports: pre- or post-norm, LayerNorm with or without biases or
RMSNorm, learned / sinusoidal / rotary positions, scaled embeddings, relu / gelu /
gelu_tanh / silu / swiglu, grouped-query attention, a tied or untied head and an output bias,
Qwen2's q/k/v biases (the fused projection's bias) and Llama 3's rotary scaling
(``RotaryScalingType.Llama3`` with its factor, low / high frequency factors and original
context). An imported model's embedding may have more rows than its tokenizer has tokens
(Qwen2 pads it): the caller names the spare ids (``<unused_N>`` in ``transformer export``).

Refused (ValueError), for both kinds: a post-norm model with a final norm (CTranslate2 has
a final norm only in pre-norm models), and a vocabulary that is not one distinct string
per id.

Quantisation. ``quantization="int8"`` stores int8 weights (a quarter of the size);
CTranslate2 can also quantise an fp32 model when loading it:
``ctranslate2.Translator(path, compute_type="int8")``.

``ctranslate2`` is an optional dependency (the ``export`` extra), imported inside the functions.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from ..extras import require
from ..model import Transformer
from ..model.lm import LanguageModel
from ..run.layout import SUBWORDS

if TYPE_CHECKING:  # pragma: no cover
    from ctranslate2.specs import TransformerDecoderModelSpec, TransformerSpec

SPECIALS = ("pad_id", "bos_id", "eos_id")
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16", "float32")


def _check(cond: bool, msg: str, where: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {msg}")


def _check_model(cfg, vocab: list[str], where: str, norm: str, ids: str) -> None:
    """What CTranslate2 cannot express, and a vocabulary that does not fit the model's ids
    (``norm`` and ``ids``: their words in the messages)."""
    _check(not (cfg.use_final_norm and not cfg.norm_first),
           f"CTranslate2 has a final {norm} only in pre-norm models; this post-norm model has one", where)
    _check(len(vocab) == cfg.vocab_size == cfg.target_vocab_size,
           f"{len(vocab)} vocabulary entries, but the model has {ids}", where)
    _check(len(set(vocab)) == len(vocab), "the vocabulary has duplicate entries", where)


# ---- filling the spec -----------------------------------------------------------------------

def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float32).numpy().copy()


def _linear(spec, *layers: nn.Linear) -> None:
    """Fill a LinearSpec with one Linear, or several fused along the output axis (no bias
    when they have none)."""
    spec.weight = np.concatenate([_np(m.weight) for m in layers], axis=0)
    if layers[0].bias is not None:
        spec.bias = np.concatenate([_np(m.bias) for m in layers], axis=0)


def _norm(spec, norm: nn.Module) -> None:
    """Fill a LayerNormSpec from a LayerNorm (zero beta when it has no bias) or an RMSNorm."""
    spec.gamma = _np(norm.weight)
    if isinstance(norm, nn.LayerNorm):  # RMSNorm specs have no beta
        spec.beta = _np(norm.bias) if norm.bias is not None else np.zeros_like(spec.gamma)


def _self_attention(spec, block, att) -> None:
    _norm(spec.layer_norm, block.norm)
    _linear(spec.linear[0], att.q_proj, att.k_proj, att.v_proj)
    _linear(spec.linear[1], att.out_proj)


def _ffn(spec, block, ffn) -> None:
    _norm(spec.layer_norm, block.norm)
    if ffn.gate is not None:  # swiglu: CT2 computes act(linear_0 x) * linear_0_noact x
        _linear(spec.linear_0, ffn.gate)
        _linear(spec.linear_0_noact, ffn.fc1)
    else:
        _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)


def _stack(spec, stack) -> None:
    """Fill an encoder or decoder spec's layers and final norm from our Encoder or Decoder."""
    if stack.norm is not None:
        _norm(spec.layer_norm, stack.norm)
    for ls, layer in zip(spec.layer, stack.layers):
        _self_attention(ls.self_attention, getattr(layer, "attn_block", None) or layer.self_block, layer.self_attn)
        cross = getattr(layer, "cross_attn", None)
        if cross is not None:  # the translation decoder
            _linear(ls.attention.linear[0], cross.q_proj)
            _linear(ls.attention.linear[1], cross.k_proj, cross.v_proj)
            _linear(ls.attention.linear[2], cross.out_proj)
            _norm(ls.attention.layer_norm, layer.cross_block.norm)
        _ffn(ls.ffn, layer.ffn_block, layer.ffn)


def _spec_options(cfg) -> dict:
    """The encoder / decoder spec options both model kinds share."""
    return dict(pre_norm=cfg.norm_first, no_final_norm=not cfg.use_final_norm,
                activation=_activation(cfg.ffn_activation), ffn_glu=cfg.ffn_activation == "swiglu")


def _activation(name: str):
    require("ctranslate2", "export", __name__)
    from ctranslate2.specs import common_spec

    act = common_spec.Activation
    # F.gelu is the exact (erf) GELU, CT2's GELU; swiglu is silu-gated (SWISH with a GLU)
    return {"relu": act.RELU, "gelu": act.GELU, "gelu_tanh": act.GELUTanh, "silu": act.SWISH,
            "swiglu": act.SWISH}[name]


def _projection(spec, model) -> None:
    weight, bias = model.output_layer()
    spec.weight = _np(weight)  # tied: equal arrays are stored once (aliases)
    if bias is not None:
        spec.bias = _np(bias)


def _tokens(c, cfg, vocab: list[str]) -> None:
    """The spec config's special tokens (the pieces of our ids) and norm eps."""
    c.unk_token = "<unk>" if "<unk>" in vocab else vocab[cfg.pad_id]
    c.bos_token = vocab[cfg.bos_id]
    c.eos_token = vocab[cfg.eos_id]
    c.layer_norm_epsilon = float(cfg.layer_norm_eps)


def _finish(spec, cfg, vocab: list[str]):
    """Set the special tokens, then validate and return ``spec``."""
    _tokens(spec.config, cfg, vocab)
    spec.validate()
    return spec


def _save_spec(build: Callable[[], Any], out_dir: str | Path, quantization: str | None) -> Path:
    """Build a spec (``build()``), quantise it and write it to ``out_dir`` (must not exist or
    be empty). Returns the directory."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    spec = build()
    spec.optimize(quantization=quantization)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise ValueError(f"{out_dir}: not empty")
    spec.save(str(out_dir))
    return out_dir


# ---- export ---------------------------------------------------------------------------------


@torch.no_grad()
def to_ctranslate2_spec(model: Transformer, vocab: list[str]) -> "TransformerSpec":
    """A validated ``ctranslate2.specs.TransformerSpec`` computing what ``model`` computes.

    Args:
        model: our Transformer (any dtype; weights are written as float32).
        vocab: the token strings in id order (``Subwords.vocab()``), one per id of the
            source and target vocabularies (one joint vocabulary).

    Raises:
        ValueError: for what CTranslate2 cannot express (a final LayerNorm on a post-norm
            model) or a vocabulary that does not fit the model.
    """
    require("ctranslate2", "export", __name__)
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    _check_model(cfg, vocab, "to_ctranslate2", "LayerNorm",
                 f"{cfg.vocab_size} source and {cfg.target_vocab_size} target ids; one joint vocabulary is needed")
    for name in SPECIALS:
        _check(getattr(cfg, name) < len(vocab), f"{name} is outside the vocabulary", "to_ctranslate2")

    options = _spec_options(cfg)
    spec = transformer_spec.TransformerSpec(transformer_spec.TransformerEncoderSpec(cfg.n_layers, cfg.n_heads, **options),
                                            transformer_spec.TransformerDecoderSpec(cfg.n_layers, cfg.n_heads, **options))
    positions = _np(model.positions.pe)  # (max_len, C), whatever the layout
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _np(model.src_embed.weight)
    dec.embeddings.weight = _np(model.tgt_embed.weight)
    enc.scale_embeddings = dec.scale_embeddings = True  # x sqrt(d_model), as TokenEmbedding does
    enc.position_encodings.encodings = dec.position_encodings.encodings = positions
    dec.start_from_zero_embedding = False  # the decoder starts from BOS's embedding
    _stack(enc, model.encoder)
    _stack(dec, model.decoder)
    _projection(dec.projection, model)

    c = spec.config
    c.decoder_start_token = vocab[cfg.bos_id]
    c.add_source_bos = False
    c.add_source_eos = True  # the Translator feeds `ids + [eos]`
    spec.register_source_vocabulary(list(vocab))
    spec.register_target_vocabulary(list(vocab))
    return _finish(spec, cfg, vocab)


@torch.no_grad()
def to_ctranslate2_lm_spec(model: LanguageModel, vocab: list[str]) -> "TransformerDecoderModelSpec":
    """A validated ``ctranslate2.specs.TransformerDecoderModelSpec`` computing what
    ``model`` computes. ``vocab``: one distinct string per id, in id order."""
    require("ctranslate2", "export", __name__)
    from ctranslate2.specs import transformer_spec

    where = "to_ctranslate2_lm"
    _check(isinstance(model, LanguageModel), f"expected a LanguageModel, got {type(model).__name__}", where)
    cfg = model.cfg
    _check_model(cfg, vocab, where, "norm", f"{cfg.vocab_size} ids")
    rope = cfg.positions == "rope"
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        cfg.n_layers, cfg.n_heads, **_spec_options(cfg),
        rms_norm=cfg.norm == "rms",
        rotary_dim=0 if rope else None,  # 0: the whole head
        rotary_interleave=False,  # "rotate half", as ours and HF's
        rotary_base=float(cfg.rope_theta),
        **_rope_scaling(cfg.rope_scaling),
        num_heads_kv=None if cfg.kv_heads == cfg.n_heads else cfg.kv_heads,
    )
    dec = spec.decoder
    if cfg.rope_scaling is not None:
        _llama3_factors(dec, cfg.rope_scaling)
    dec.embeddings.weight = _np(model.embed.weight)
    dec.scale_embeddings = bool(cfg.embed_scale)
    if not rope:
        table = model.positions.weight if cfg.positions == "learned" else model.positions.pe
        dec.position_encodings.encodings = _np(table)
    _stack(dec, model.decoder)
    _projection(dec.projection, model)
    spec.register_vocabulary(list(vocab))
    return _finish(spec, cfg, vocab)


def _rope_scaling(scaling: dict[str, float] | None) -> dict:
    """The spec options of Llama 3's rotary frequency scaling (none when unscaled)."""
    if scaling is None:
        return {}
    from ctranslate2.specs.attention_spec import RotaryScalingType

    return dict(rotary_scaling_type=RotaryScalingType.Llama3,
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]))


def _llama3_factors(dec, scaling: dict[str, float]) -> None:
    """Each self-attention's Llama 3 factors. The spec declares the low and high frequency
    factors only, but CTranslate2 reads ``rotary_scaling_factor`` for this scaling too
    (without it the factor is 1: no scaling), so it is added past the spec's guard; the
    parity test (tests/interop/test_imported_commands.py) holds CTranslate2 to our logits."""
    for layer in dec.layer:
        att = layer.self_attention
        att.rotary_low_freq_factor = np.float32(scaling["low_freq_factor"])
        att.rotary_high_freq_factor = np.float32(scaling["high_freq_factor"])
        object.__setattr__(att, "rotary_scaling_factor", np.float32(scaling["factor"]))


def save_ctranslate2(model: Transformer, out_dir: str | Path, vocab: list[str],
                     subwords_model: str | Path | None = None, quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory (``model.bin``, ``config.json``,
    ``shared_vocabulary.json``, and a copy of ``subwords_model`` when given).

    ``out_dir`` must not exist or be empty. ``quantization`` is one of :data:`QUANTIZATIONS`
    or None (float32). Returns the directory.
    """
    out_dir = _save_spec(lambda: to_ctranslate2_spec(model, vocab), out_dir, quantization)
    if subwords_model is not None:
        shutil.copyfile(subwords_model, out_dir / SUBWORDS)
    return out_dir


def save_ctranslate2_lm(model: LanguageModel, out_dir: str | Path, vocab: list[str],
                        quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory for ``ctranslate2.Generator`` (``model.bin``,
    ``config.json``, ``vocabulary.json``). ``out_dir`` must not exist or be empty;
    ``quantization`` is one of :data:`QUANTIZATIONS` or None (float32). Returns the directory."""
    return _save_spec(lambda: to_ctranslate2_lm_spec(model, vocab), out_dir, quantization)
