"""An int8 decoding copy's projections that read the same input, multiplied as one int8 layer:
each self-attention's W_Q, W_K, W_V, and a gated FFN's W_up and W_gate. One call quantises the
input once and makes one pass over the weights, where three (two) made three; at a language
model's one-row steps the calls' fixed costs are a tenth of the step (``benchmarks/lm/README.md``).

The int8 weights are the layers' own, side by side: each output row keeps its own scale, so
the fused layer holds exactly what the separate ones held, and the separate layers become views
of it (no second copy). Its kernel is measured at the fused shape
(:func:`transformer.decode.choose.int8_kernels`). With the int8 GEMMs (fbgemm, ``torch._int_mm``)
every output is the same integer sum rescaled as before, so the outputs do not change.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..model.attention import split_projections
from ..model.layers import FeedForward
from .decoding_copy import GroupedAttend
from .int8 import Int8Attention, Int8Linear


class FusedInt8Attention(GroupedAttend, Int8Attention):
    """An int8 attention whose self-attention projections (W_Q, W_K, W_V) run as one int8 layer
    (``qkv``); any other projections applied together (cross-attention's) as :class:`Int8Attention`.

    Under grouped-query attention, one new position a row (a generation step) attends without
    copying each K, V head to the query heads it serves: the ``group`` queries that share a head
    attend as that head's ``group`` positions (each query's softmax is its own). The copies
    grow with the cache (at 8 rows and 150 positions, 110 MB a step for a Qwen2-0.5B shape)."""

    qkv: Int8Linear

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        sizes = [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features]
        return tuple(split_projections(self.qkv(x), sizes, self.d_head))


class FusedInt8FeedForward(FeedForward):
    """A gated (SwiGLU) FFN whose W_up (``fc1``) and W_gate run as one int8 layer (``up_gate``)."""

    up_gate: Int8Linear

    def hidden(self, x: Tensor) -> Tensor:
        h, g = self.up_gate(x).split(self.fc1.out_features, dim=-1)
        return h * F.silu(g)


def fused(layers: list[Int8Linear], kernel: str) -> Int8Linear:
    """One :class:`Int8Linear` holding ``layers``' rows in order (their int8 weights, scales and
    biases), multiplying with ``kernel``; each of ``layers`` then reads its rows of it (views)."""
    qweight = torch.cat([lin.qweight for lin in layers])
    scale = torch.cat([lin.scale for lin in layers])
    bias = None if layers[0].bias is None else torch.cat([lin.bias for lin in layers])
    out = Int8Linear(qweight, scale, bias, kernel)
    start = 0
    for lin in layers:  # the layer's own rows of the fused buffers: no second copy of the weights
        rows = slice(start, start + lin.out_features)
        start = rows.stop
        lin.qweight, lin.scale = out.qweight[rows], out.scale[rows]
        lin._scale_col = out._scale_col[rows] if lin._scale_col.dtype == out._scale_col.dtype else lin._scale_col
        if lin.bias is not None:
            lin.bias = out.bias[rows]
        lin._packed = None
    return out


def fuse_projections(model: nn.Module) -> nn.Module:
    """In place, on an int8 decoding copy (its linear layers :class:`Int8Linear`, its attentions
    :class:`Int8Attention`): every self-attention's Q, K, V and every gated FFN's up and gate
    projections as one int8 layer each, its kernel measured at its shape. Returns ``model``."""
    from .choose import int8_kernels

    groups = []  # (module, its new class, the attribute, the layers fused)
    for name, m in model.named_modules():  # (self-attentions only: cross-attention projects its query alone)
        if type(m) is Int8Attention and name.rsplit(".", 1)[-1] == "self_attn" \
                and all(isinstance(p, Int8Linear) for p in (m.q_proj, m.k_proj, m.v_proj)):
            groups.append((m, FusedInt8Attention, "qkv", [m.q_proj, m.k_proj, m.v_proj]))
        elif type(m) is FeedForward and m.gate is not None and isinstance(m.fc1, Int8Linear) \
                and isinstance(m.gate, Int8Linear):
            groups.append((m, FusedInt8FeedForward, "up_gate", [m.fc1, m.gate]))
    groups = [g for g in groups if len({(lin.in_features, lin.bias is None) for lin in g[3]}) == 1]
    if not groups:
        return model
    shapes = [(g[3][0].in_features, sum(lin.out_features for lin in g[3])) for g in groups]
    kernels = int8_kernels(shapes)
    for (module, cls, name, layers), shape in zip(groups, shapes):
        layer = fused(layers, kernels[shape])
        module.__class__ = cls
        module.add_module(name, layer)
    return model
