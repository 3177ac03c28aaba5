"""Hugging Face Marian (``MarianMTModel``) import and export.

HF's Marian is the paper's post-norm Transformer with four fixed choices: embeddings
scaled by sqrt(d_model) (``scale_embedding=True``), sinusoidal positions laid out
[sin | cos] (our ``sinusoid_layout="concat"``; HF's table is bit-identical to ours),
no final LayerNorm after either stack, and a bias on the vocabulary projection
(``final_logits_bias``, our ``output_bias``). Decoding starts from
``decoder_start_token_id``, which is the pad id in Marian, so ``bos_id == pad_id``.

Name map (:func:`name_map`; ours <- HF, HF names under ``model.``):
    src_embed / tgt_embed                  <- encoder.embed_tokens / decoder.embed_tokens
    out_proj, out_bias                     <- lm_head, final_logits_bias
    *.self_attn.{q,k,v,out}_proj           <- *.self_attn.{q,k,v,out}_proj
    decoder.layers[i].cross_attn           <- decoder.layers[i].encoder_attn
    *.ffn.fc1 / fc2                        <- *.fc1 / fc2
    encoder.layers[i].attn_block.norm      <- encoder.layers[i].self_attn_layer_norm
    decoder.layers[i].self_block.norm      <- decoder.layers[i].self_attn_layer_norm
    decoder.layers[i].cross_block.norm     <- decoder.layers[i].encoder_attn_layer_norm
    *.ffn_block.norm                       <- *.final_layer_norm

Not carried over: HF's ``activation_dropout`` (dropout inside the FFN, training only) and
layer drop. The tokenizer files and decoding settings that :func:`save_marian` can add are
in :mod:`.marian_files`; a whole Marian folder (weights, tokenizer, generation config)
becomes a translation run in :mod:`.marian_run` (``transformer import``). ``transformers`` is imported inside the functions: it is an optional dependency.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import Tensor

from ..model.config import ModelConfig
from ..extras import require
from ..model import Transformer
from ..model.embedding import sinusoid_table
from ._hf import check as _check
from ._hf import copy_ as _copy
from .sinusoid_permutation import to_concat_layout

if TYPE_CHECKING:  # pragma: no cover
    from transformers import MarianConfig, MarianMTModel

    from ..data import Subwords
    from ..decode.decoding_config import DecodingConfig

# HF's name for an activation -> ours. ("swish" is the name in converted OPUS-MT configs.)
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu"}
_HF_LAYER_NORM_EPS = 1e-5  # HF Marian builds nn.LayerNorm(d_model) with the default eps
_POSITION_TOL = 1e-6


# ---- the config ---------------------------------------------------------------------------
# Our field -> MarianConfig's: the encoder's and then the decoder's where Marian has one for
# each stack (ours has one for both, so the two must be equal).
_SHAPE = {"d_model": ("d_model",), "n_layers": ("encoder_layers", "decoder_layers"),
          "n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
          "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"), "max_len": ("max_position_embeddings",)}


def config_from_marian(hf_config: "MarianConfig", tie_embeddings: bool, src_vocab: int,
                       tgt_vocab: int) -> ModelConfig:
    """Our ModelConfig for a MarianConfig. ``tie_embeddings`` and the vocabulary sizes come
    from the model's tensors, which say more than the config flags (see :func:`from_marian`)."""
    c, where = hf_config, "from_marian"
    for ours, (encoder, *decoder) in _SHAPE.items():
        for name in decoder:
            _check(getattr(c, encoder) == getattr(c, name), where,
                   f"{encoder} ({getattr(c, encoder)}) != {name} ({getattr(c, name)}); our model has one {ours} "
                   "for both stacks")
    _check(bool(c.scale_embedding), where,
           "scale_embedding=False is not supported: our embeddings are always scaled by sqrt(d_model)")
    _check(c.activation_function in _ACTIVATIONS, where,
           f"activation_function {c.activation_function!r} is not supported; use one of {sorted(_ACTIVATIONS)}")
    eos = c.eos_token_id
    if isinstance(eos, (list, tuple)):
        _check(len(eos) == 1, where, f"one eos_token_id is needed, got {eos}")
        eos = eos[0]
    _check(c.pad_token_id is not None and c.decoder_start_token_id is not None and eos is not None, where,
           "pad_token_id, decoder_start_token_id and eos_token_id must all be set")
    return ModelConfig(
        vocab_size=src_vocab,
        tgt_vocab_size=None if tgt_vocab == src_vocab else tgt_vocab,
        tie_embeddings=tie_embeddings,
        **{ours: getattr(c, names[0]) for ours, names in _SHAPE.items()},
        dropout=float(c.dropout),
        attn_dropout=float(c.attention_dropout),
        norm_first=False,  # HF Marian is always post-norm (MarianConfig has no normalize_before)
        final_norm=False,  # and has no LayerNorm after either stack
        ffn_activation=_ACTIVATIONS[c.activation_function],
        sinusoid_layout="concat",
        output_bias=True,  # holds final_logits_bias
        layer_norm_eps=_HF_LAYER_NORM_EPS,
        pad_id=c.pad_token_id,
        bos_id=c.decoder_start_token_id,
        eos_id=int(eos),
    )


def config_to_marian(cfg: ModelConfig) -> "MarianConfig":
    """The MarianConfig for one of our configs; ValueError when HF Marian cannot express it."""
    require("transformers", "interop", __name__)
    from transformers import MarianConfig

    where = "to_marian"
    _check(cfg.sinusoid_layout == "concat", where,
           "HF Marian lays out positions as [sin | cos]: needs sinusoid_layout='concat'")
    _check(not cfg.norm_first, where, "HF Marian is post-norm: needs norm_first=False")
    _check(not cfg.use_final_norm, where, "HF Marian has no final LayerNorm: needs final_norm=False")
    _check(cfg.ffn_activation != "swiglu", where, "HF Marian has no gated (swiglu) feed-forward")
    _check(abs(cfg.layer_norm_eps - _HF_LAYER_NORM_EPS) < 1e-12, where,
           f"HF Marian's LayerNorm eps is {_HF_LAYER_NORM_EPS}, the model has {cfg.layer_norm_eps}")
    return MarianConfig(
        vocab_size=cfg.vocab_size,
        decoder_vocab_size=cfg.target_vocab_size,
        share_encoder_decoder_embeddings=cfg.tie_embeddings,
        tie_word_embeddings=cfg.tie_embeddings,
        **{name: getattr(cfg, ours) for ours, names in _SHAPE.items() for name in names},
        activation_function=cfg.ffn_activation,
        dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=cfg.pad_id,
        decoder_start_token_id=cfg.bos_id,
        eos_token_id=cfg.eos_id,
        # A generation setting: to_marian puts it in the generation config (transformers 4
        # warns when a model config holds one; MarianConfig's own default would be 0).
        forced_eos_token_id=None,
    )


# ---- the weights --------------------------------------------------------------------------
# each stack's attention sub-layers: (our attention, our block, HF's attention, HF's norm after it)
_SUBLAYERS = {"encoder": [("self_attn", "attn_block", "self_attn", "self_attn_layer_norm")],
              "decoder": [("self_attn", "self_block", "self_attn", "self_attn_layer_norm"),
                          ("cross_attn", "cross_block", "encoder_attn", "encoder_attn_layer_norm")]}
EMBEDDINGS = {"src_embed.weight": "model.encoder.embed_tokens.weight",
              "tgt_embed.weight": "model.decoder.embed_tokens.weight", "out_proj.weight": "lm_head.weight"}


def name_map(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our name, HF ``MarianMTModel`` state-dict name) for every tensor of our model for
    ``cfg`` (the module docstring's map), a tied one once: ``src_embed`` only. Our ``out_bias``
    (V,) is HF's ``final_logits_bias`` (1, V)."""
    embeddings = ["src_embed.weight"] if cfg.tie_embeddings else list(EMBEDDINGS)
    out = [(ours, EMBEDDINGS[ours]) for ours in embeddings]
    for stack, sublayers in _SUBLAYERS.items():
        for i in range(cfg.n_layers):
            modules = []
            for attn, block, hf_attn, hf_norm in sublayers:
                modules += [(f"{attn}.{p}", f"{hf_attn}.{p}") for p in ("q_proj", "k_proj", "v_proj", "out_proj")]
                modules.append((f"{block}.norm", hf_norm))
            modules += [("ffn.fc1", "fc1"), ("ffn.fc2", "fc2"), ("ffn_block.norm", "final_layer_norm")]
            out += [(f"{stack}.layers.{i}.{ours}.{p}", f"model.{stack}.layers.{i}.{theirs}.{p}")
                    for ours, theirs in modules for p in ("weight", "bias")]
    out.append(("out_bias", "final_logits_bias"))
    return out


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor of :func:`name_map` in our model for ``cfg`` (HF's are the same
    but ``final_logits_bias``, (1, V)), without building a model: an import checks the
    checkpoint against them, and a model built on the meta device would import torch's
    compiler (its meta kernels do), some 70 MB."""
    c, f, v = cfg.d_model, cfg.d_ff, cfg.target_vocab_size
    rows = {"src_embed.weight": cfg.vocab_size, "tgt_embed.weight": v, "out_proj.weight": v}
    shapes: dict[str, tuple[int, ...]] = {}
    for ours, _ in name_map(cfg):
        if ours in rows:
            shapes[ours] = (rows[ours], c)
        elif ours == "out_bias":
            shapes[ours] = (v,)
        elif ".ffn.fc" in ours:
            out, into = (f, c) if ".fc1." in ours else (c, f)
            shapes[ours] = (out, into) if ours.endswith("weight") else (out,)
        else:  # attention projections (C, C) and their biases, LayerNorms
            shapes[ours] = (c, c) if ours.endswith("_proj.weight") else (c,)
    return shapes


def _tensor_pairs(model: Transformer, hf: "MarianMTModel") -> Iterator[tuple[str, Tensor, Tensor]]:
    """(our name, our tensor, HF tensor) for every weight but ``out_bias``; a tied one appears
    once. The tensors are the models' own (state-dict views), to copy into."""
    ours, theirs = model.state_dict(), hf.state_dict()
    for name, hf_name in name_map(model.cfg):
        if name != "out_bias":
            yield name, ours[name], theirs[hf_name]


def check_positions(cfg: ModelConfig, tables: Iterable[Tensor], where: str) -> float:
    """HF keeps its own sinusoid table for each stack (``tables``); it must be ours for
    ``cfg`` (it is, bit for bit, in transformers 5.x), or one model would compute something
    the other cannot. Returns the max abs diff; ValueError beyond the tolerance."""
    tables = list(tables)
    if not tables:  # nothing to compare: no table of max_len rows is computed
        return 0.0
    ours = sinusoid_table(cfg.max_len, cfg.d_model, cfg.sinusoid_layout).float()
    diff = 0.0
    for table in tables:
        table = table.detach().float().cpu()
        _check(table.shape == ours.shape, where,
               f"position table {tuple(table.shape)} != ours {tuple(ours.shape)}")
        diff = max(diff, (table - ours).abs().max().item())
    _check(diff <= _POSITION_TOL, where,
           f"HF's sinusoidal position table differs from ours by {diff:.3g} (was it left uninitialised?)")
    return diff


def _model_positions(hf: "MarianMTModel") -> list[Tensor]:
    return [stack.embed_positions.weight for stack in (hf.model.encoder, hf.model.decoder)]


def _is_marian(hf_model: object) -> bool:
    return isinstance(hf_model, require("transformers", "interop", __name__).MarianMTModel)


# ---- import ---------------------------------------------------------------------------------
@torch.no_grad()
def from_marian(hf_model: "MarianMTModel") -> Transformer:
    """Build our Transformer from a ``transformers.MarianMTModel``, copying every weight.

    The result computes the same logits as ``hf_model(input_ids, attention_mask,
    decoder_input_ids)`` with ``attention_mask = input_ids != pad``. It takes the HF model's
    dtype, device and train/eval mode.

    Embeddings are tied in our model only when the HF model's encoder embedding, decoder
    embedding and ``lm_head`` hold the same values. (In transformers 5.x,
    ``share_encoder_decoder_embeddings=True`` with ``tie_word_embeddings=False`` gives three
    independent matrices, so the config flags alone do not say it.) Otherwise each matrix is
    copied into its own tensor.

    Raises:
        ValueError: when the Marian model has something our model cannot express (different
            encoder/decoder depth, heads or d_ff, unscaled embeddings, another activation).
    """
    where = "from_marian"
    _check(_is_marian(hf_model), where, f"expected a transformers.MarianMTModel, got {type(hf_model).__name__}")
    enc = hf_model.model.encoder.embed_tokens.weight
    dec = hf_model.model.decoder.embed_tokens.weight
    head = hf_model.lm_head.weight
    tie = enc.shape == dec.shape == head.shape and torch.equal(enc, dec) and torch.equal(dec, head)
    cfg = config_from_marian(hf_model.config, tie, enc.size(0), dec.size(0))
    _check(head.size(0) == cfg.target_vocab_size, where,
           f"lm_head has {head.size(0)} rows but the decoder vocabulary has {cfg.target_vocab_size}")

    model = Transformer(cfg)
    check_positions(cfg, _model_positions(hf_model), where)
    model.to(device=enc.device, dtype=enc.dtype)
    for name, ours, theirs in _tensor_pairs(model, hf_model):
        _copy(ours, theirs, name, where)
    _copy(model.out_bias, hf_model.final_logits_bias.view(-1), "out_bias", where)
    model.train(hf_model.training)
    return model


def load_marian(path: str | Path) -> Transformer:
    """Load a local Hugging Face Marian directory (``config.json`` and weights) and convert
    it with :func:`from_marian`. Never downloads: ``path`` must be a directory on disk."""
    require("transformers", "interop", __name__)
    from transformers import MarianMTModel

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory; load_marian reads a local Hugging Face "
                                "Marian directory (config.json and model weights), it never downloads")
    return from_marian(MarianMTModel.from_pretrained(path, local_files_only=True))


# ---- export ---------------------------------------------------------------------------------
@torch.no_grad()
def to_marian(model: Transformer) -> "MarianMTModel":
    """A ``transformers.MarianMTModel`` computing the same logits as ``model``.

    A model with the paper's interleaved positions is first converted, exactly, to the
    [sin | cos] layout (:func:`~transformer.interop.sinusoid_permutation.to_concat_layout`).
    The model needs what HF Marian has: post-norm, no final
    LayerNorm, relu/gelu/silu and layer_norm_eps 1e-5 (ValueError otherwise). A model
    without ``output_bias`` gets a zero ``final_logits_bias``. The generation config blocks
    PAD (and BOS) as next tokens, as our own searches do. Takes the model's dtype, device and
    train/eval mode.
    """
    require("transformers", "interop", __name__)
    from transformers import MarianMTModel

    where = "to_marian"
    model = to_concat_layout(model)  # the paper's interleaved positions -> Marian's [sin | cos]
    cfg = model.cfg
    hf = MarianMTModel(config_to_marian(cfg))
    check_positions(cfg, _model_positions(hf), where)
    weight = model.src_embed.weight
    hf.to(device=weight.device, dtype=weight.dtype)
    for name, ours, theirs in _tensor_pairs(model, hf):
        _copy(theirs, ours, name, where)
    out_bias = model.output_layer()[1]
    if out_bias is not None:
        _copy(hf.final_logits_bias, out_bias.view(1, -1), "final_logits_bias", where)
    else:
        hf.final_logits_bias.zero_()
    blocked = [cfg.pad_id] if cfg.bos_id == cfg.pad_id else [cfg.pad_id, cfg.bos_id]
    hf.generation_config.bad_words_ids = [[t] for t in blocked]
    hf.generation_config.forced_eos_token_id = cfg.eos_id  # EOS at the length limit, as ours
    # It now says more than config.json: without this, transformers 4 rebuilds it from
    # config.json when generating, and the settings above are lost.
    hf.generation_config._from_model_config = False
    hf.train(model.training)
    return hf


def save_marian(model: Transformer, out_dir: str | Path, subwords: "Subwords | None" = None, *,
                decoding: "DecodingConfig | None" = None, source_lang: str | None = None,
                target_lang: str | None = None) -> Path:
    """Export with :func:`to_marian` and write a Hugging Face directory (``config.json``,
    ``generation_config.json``, safetensors weights) that ``MarianMTModel.from_pretrained``
    and :func:`load_marian` read. Returns the directory.

    With ``subwords`` (the run's subword model) it also writes ``MarianTokenizer``'s files, and
    with ``decoding`` the search settings (beam, length penalty, length limit) into
    ``generation_config.json``, so that ``MarianTokenizer`` and ``generate`` (and, in
    transformers 4, ``pipeline("translation", model=out_dir)``) translate as ours does; see
    :mod:`.marian_files` for what carries over exactly and what does not.
    """
    from .marian_files import generation_settings, save_marian_tokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = to_marian(model)
    if decoding is not None:
        for name, value in generation_settings(decoding, model.cfg).items():
            setattr(hf.generation_config, name, value)
    hf.save_pretrained(out_dir)
    if subwords is not None:
        save_marian_tokenizer(subwords, out_dir, model.cfg.max_len, source_lang, target_lang)
    return out_dir
