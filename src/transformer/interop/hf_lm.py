"""The Hugging Face decoder-only language models, as one name map to our
:class:`~transformer.model.lm.LanguageModel`: each of our tensors is one HF tensor, possibly
transformed (GPT-2's ``Conv1D`` weights are transposed, its ``c_attn`` split in three).

Families (``model_type`` in ``config.json``):
    gpt2                     learned positions, LayerNorm, GELU (tanh), Conv1D weights (:mod:`.gpt2`)
    llama, mistral, qwen2    rotary positions, RMSNorm, SwiGLU; one set of names (:mod:`.llama`)

HF names are those of the ``*ForCausalLM`` state dict (``model.layers.0.self_attn.q_proj.weight``,
``transformer.h.0.attn.c_attn.weight``, ``lm_head.weight``). :func:`tensors_from_hf` reads
through a ``get(name)`` callable, so a caller decides how tensors arrive: a model's state dict
(``from_llama``, ``from_gpt2``) or one tensor at a time from files (:mod:`.hf_import`).
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import Tensor

from ..model.config import ModelConfig
from ..model.lm import LanguageModel
from ._hf import check, copy_

LLAMA_SHAPED = ("llama", "mistral", "qwen2")
FAMILIES = ("gpt2", *LLAMA_SHAPED)

# (our name, HF name, transform of the HF tensor into ours)
Entry = tuple[str, str, Callable[[Tensor], Tensor]]


def _same(t: Tensor) -> Tensor:
    return t


def _transposed(t: Tensor) -> Tensor:
    return t.t()


def _llama_layer(i: int, cfg: ModelConfig) -> Iterator[Entry]:
    ours, theirs = f"decoder.layers.{i}", f"model.layers.{i}"
    modules = [("self_block.norm", "input_layernorm"), ("self_attn.q_proj", "self_attn.q_proj"),
               ("self_attn.k_proj", "self_attn.k_proj"), ("self_attn.v_proj", "self_attn.v_proj"),
               ("self_attn.out_proj", "self_attn.o_proj"), ("ffn_block.norm", "post_attention_layernorm"),
               ("ffn.gate", "mlp.gate_proj"), ("ffn.fc1", "mlp.up_proj"), ("ffn.fc2", "mlp.down_proj")]
    for a, b in modules:
        yield f"{ours}.{a}.weight", f"{theirs}.{b}.weight", _same
        norm = a.endswith("norm")  # RMSNorm: no bias
        if not norm and (cfg.bias or (cfg.qkv_bias and a[-6:] in ("q_proj", "k_proj", "v_proj"))):
            yield f"{ours}.{a}.bias", f"{theirs}.{b}.bias", _same


def _columns(start: int, end: int, name: str) -> Callable[[Tensor], Tensor]:
    """Columns ``start:end`` of a Conv1D weight (in, out) as a Linear weight (out, in), or
    entries ``start:end`` of its bias."""
    def take(t: Tensor) -> Tensor:
        return t[..., start:end].t() if name == "weight" else t[start:end]
    return take


def _gpt2_layer(i: int, cfg: ModelConfig) -> Iterator[Entry]:
    ours, theirs, c = f"decoder.layers.{i}", f"transformer.h.{i}", cfg.d_model
    for name in ("weight", "bias"):
        yield f"{ours}.self_block.norm.{name}", f"{theirs}.ln_1.{name}", _same
        for k, proj in enumerate(("q_proj", "k_proj", "v_proj")):  # c_attn: W_Q, W_K, W_V side by side
            yield f"{ours}.self_attn.{proj}.{name}", f"{theirs}.attn.c_attn.{name}", _columns(k * c, (k + 1) * c, name)
        conv = _transposed if name == "weight" else _same
        yield f"{ours}.self_attn.out_proj.{name}", f"{theirs}.attn.c_proj.{name}", conv
        yield f"{ours}.ffn_block.norm.{name}", f"{theirs}.ln_2.{name}", _same
        yield f"{ours}.ffn.fc1.{name}", f"{theirs}.mlp.c_fc.{name}", conv
        yield f"{ours}.ffn.fc2.{name}", f"{theirs}.mlp.c_proj.{name}", conv


def name_map(cfg: ModelConfig, family: str) -> list[Entry]:
    """Every tensor of our model for ``cfg`` with the HF tensor it comes from."""
    check(family in FAMILIES, "hf import", f"model_type {family!r} is not supported; supported: {', '.join(FAMILIES)}")
    if family == "gpt2":
        out = [("embed.weight", "transformer.wte.weight", _same),
               ("positions.weight", "transformer.wpe.weight", _same)]
        for i in range(cfg.n_layers):
            out += _gpt2_layer(i, cfg)
        out += [("decoder.norm.weight", "transformer.ln_f.weight", _same),
                ("decoder.norm.bias", "transformer.ln_f.bias", _same)]
    else:
        out = [("embed.weight", "model.embed_tokens.weight", _same)]
        for i in range(cfg.n_layers):
            out += _llama_layer(i, cfg)
        out.append(("decoder.norm.weight", "model.norm.weight", _same))
    if not cfg.tie_embeddings:
        out.append(("out_proj.weight", "lm_head.weight", _same))
    return out


def tensors_from_hf(cfg: ModelConfig, family: str, get: Callable[[str], Tensor]) -> Iterator[tuple[str, Tensor]]:
    """(our name, tensor) for every tensor of our model, ``get(hf_name)`` giving the HF ones."""
    for ours, theirs, transform in name_map(cfg, family):
        yield ours, transform(get(theirs))


@torch.no_grad()
def model_from_state(cfg: ModelConfig, family: str, state: dict[str, Tensor], where: str) -> LanguageModel:
    """Our model for ``cfg`` with every weight copied from a HF model's ``state`` dict, on
    the device and in the dtype of its embedding."""
    embed = next(t for name, t in state.items() if name.endswith(("embed_tokens.weight", "wte.weight")))
    model = LanguageModel(cfg).to(device=embed.device, dtype=embed.dtype)
    own = model.state_dict()
    for name, tensor in tensors_from_hf(cfg, family, state.__getitem__):
        copy_(own[name], tensor, name, where)
    return model


@torch.no_grad()
def state_to_hf(model: LanguageModel, family: str, state: dict[str, Tensor], where: str) -> None:
    """Copy our weights into a HF model's ``state`` dict (its tensors, in place): the reverse
    of :func:`model_from_state` for the families whose map is one to one (Llama-shaped)."""
    check(family in LLAMA_SHAPED, where, f"{family}: no one-to-one name map")
    own = model.state_dict()
    for ours, theirs, _ in name_map(model.cfg, family):
        copy_(state[theirs], own[ours], theirs, where)
