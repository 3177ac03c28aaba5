"""Change a model's sinusoid layout without changing what it computes.

The paper's positional encoding puts sin(pos / 10000^(2i/d)) on dimension 2i and the
cosine on 2i + 1 ("interleaved"); tensor2tensor, fairseq and Marian put all sines first,
then all cosines ("concat"). The two differ by a fixed permutation P of the d_model axis.
Permuting that axis in every weight that reads or writes the residual stream (and in the
LayerNorms, which act elementwise and normalise over the whole axis) gives a model whose
hidden states are the permuted ones and whose logits are the same.
"""
from __future__ import annotations

import torch

from ..model import Transformer


def interleaved_to_concat(d_model: int) -> torch.Tensor:
    """P such that concat_table = interleaved_table[:, P]: even dims, then odd dims."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _axis(name: str) -> str | None:
    """Which axis of this parameter lives in d_model space: 'cols', 'rows', 'vec' or None."""
    if name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight"):
        return "cols"  # (V, C)
    leaf = name.rsplit(".", 2)[-2:]  # e.g. ['q_proj', 'weight']
    module, kind = leaf if len(leaf) == 2 else (None, leaf[0])
    if module in ("q_proj", "k_proj", "v_proj", "fc1", "gate"):
        return "cols" if kind == "weight" else None  # input is the residual stream
    if module in ("out_proj", "fc2"):
        return "rows" if kind == "weight" else "vec"  # output is the residual stream
    if module == "norm":
        return "vec"
    return None


@torch.no_grad()
def to_concat_layout(model: Transformer) -> Transformer:
    """An equivalent model with ``sinusoid_layout='concat'`` (the same model if it has it)."""
    cfg = model.cfg
    if cfg.sinusoid_layout == "concat":
        return model
    if cfg.d_model % 2:
        raise ValueError("the interleaved layout needs an even d_model")
    perm = interleaved_to_concat(cfg.d_model).to(model.src_embed.weight.device)
    out = Transformer(cfg.replace(sinusoid_layout="concat")).to(model.src_embed.weight.device)
    src = dict(model.named_parameters())
    for name, p in out.named_parameters():
        w = src[name]
        axis = _axis(name)
        if axis == "cols":
            w = w[:, perm]
        elif axis == "rows":
            w = w[perm, :]
        elif axis == "vec":
            w = w[perm]
        p.copy_(w)
    return out.train(model.training)
