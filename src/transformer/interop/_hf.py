"""What the Hugging Face interop modules share (:mod:`.marian`, :mod:`.llama`, :mod:`.gpt2`):
the ValueError check, the shape-checked weight copy, and for the two causal language models
the token ids both ways, the export checks they have in common and the start of an export.

``transformers`` is not imported here at module level: it is an optional dependency.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from ..model.config import ModelConfig
from ..model.lm import LanguageModel


def check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {msg}")


def copy_(dst: Tensor, src: Tensor, name: str, where: str) -> None:
    """``dst.copy_(src)``, a ValueError naming ``name`` when the shapes differ."""
    check(dst.shape == src.shape, where, f"{name}: shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.copy_(src)


def same_head(embed: Tensor, head: Tensor) -> bool:
    """Whether the output head is the embedding (one tensor, or equal values)."""
    return head is embed or (head.shape == embed.shape and torch.equal(head, embed))


# ---- causal language models (Llama, GPT-2) ---------------------------------------------------
# What HF Llama and HF GPT-2 both are, in our config's terms (check_lm_export refuses the rest).
LM_SHAPE = dict(kind="decoder-only", norm_first=True, final_norm=True, embed_scale=False, output_bias=False)


def special_ids(hf_config, vocab_size: int, where: str, pad_id: int | None = None) -> dict[str, int]:
    """Our ``pad_id`` / ``bos_id`` / ``eos_id`` for a HF causal-LM config: ``bos_id`` /
    ``eos_id`` from the config (the first id when ``eos_token_id`` is a list), ``pad_id`` from,
    in order: the ``pad_id`` argument, ``pad_token_id`` when set and different from EOS, else
    the smallest id that is neither EOS nor BOS (see the :mod:`.llama` module docstring)."""
    eos = hf_config.eos_token_id
    if isinstance(eos, (list, tuple)):
        check(len(eos) > 0, where, "eos_token_id is an empty list")
        eos = eos[0]
    bos = hf_config.bos_token_id
    eos = 2 if eos is None else int(eos)
    bos = eos if bos is None else int(bos)
    if pad_id is None:
        pad = hf_config.pad_token_id
        if pad is None or int(pad) == eos:
            free = [i for i in range(min(vocab_size, 3)) if i not in (eos, bos)]
            pad = free[0] if free else (1 if eos == 0 else 0)
        pad_id = int(pad)
    check(pad_id != eos, where, f"pad_id ({pad_id}) must differ from eos_id ({eos})")
    for name, v in (("pad_id", pad_id), ("bos_id", bos), ("eos_id", eos)):
        check(0 <= v < vocab_size, where, f"{name}={v} is outside the vocabulary of {vocab_size}")
    return dict(pad_id=pad_id, bos_id=bos, eos_id=eos)


def hf_special_ids(cfg: ModelConfig) -> dict[str, int]:
    """The HF causal-LM config's token ids for our config (the reverse of :func:`special_ids`)."""
    return dict(pad_token_id=cfg.pad_id, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id)


def check_lm_export(cfg: ModelConfig, where: str, hf_name: str, norm: str) -> None:
    """The checks HF Llama and HF GPT-2 both need of our config: decoder-only, pre-norm with
    a final norm, unscaled embeddings, no output bias, and the family's ``norm`` ("layer" or
    "rms"). ``hf_name``: "HF Llama", ..."""
    check(cfg.decoder_only, where, "needs a decoder-only model (kind='decoder-only')")
    check(cfg.norm_first and cfg.use_final_norm, where,
          f"{hf_name} is pre-norm with a final norm: needs norm_first=True and final_norm on")
    check(not cfg.embed_scale, where, f"{hf_name} does not scale embeddings: needs embed_scale=False")
    check(not cfg.output_bias, where, f"{hf_name}'s lm_head has no bias: needs output_bias=False")
    norm_name = {"layer": "LayerNorm", "rms": "RMSNorm"}[norm]
    check(cfg.norm == norm, where, f"{hf_name} uses {norm_name}: needs norm={norm!r}, the model has {cfg.norm!r}")


def new_hf_lm(model: LanguageModel, hf_class: type, config_to: Callable[[ModelConfig], Any], where: str):
    """The start of an export: ``hf_class(config_to(model.cfg))`` on the model's device and
    dtype (its weights not yet copied); ValueError when ``model`` is not a LanguageModel."""
    check(isinstance(model, LanguageModel), where, f"expected a LanguageModel, got {type(model).__name__}")
    hf = hf_class(config_to(model.cfg))
    weight = model.embed.weight
    return hf.to(device=weight.device, dtype=weight.dtype)
