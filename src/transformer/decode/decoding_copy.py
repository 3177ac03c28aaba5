"""The copy of a float model that decoding runs: the model's own weights (shared, not copied)
and modules of its own, so that what only decoding wants (weights concatenated once, a
faster kernel) stays out of the model the caller holds and out of ``model/``.

    fused q/k/v   every attention's projections that run as one matmul (each layer's Q, K, V;
                  the decoder's cross-attention K, V of every layer) get their weights
                  concatenated once, here, not at every step (:class:`DecodingAttention`);
                  the same numbers, the same kernel
    one query     a decoding step's self-attention (one query over the cached keys) in float32
                  by matmul, softmax, matmul rather than torch's fused kernel, from 16 keys on
                  (:func:`step_attention`)
    oneDNN        a linear layer, or the output projection, whose shape measured faster through
                  oneDNN's linear than through ``F.linear`` (which runs MKL's GEMM in float32:
                  on an AMD EPYC 1.6-1.8x slower at an opus-mt vocabulary) multiplies there
                  (:func:`onednn_linear`); which shapes do is measured on the machine at hand
                  (:func:`transformer.decode.choose.onednn_shapes`)

A graph being compiled or exported takes the model's own path (``torch.compiler.is_compiling``):
the compiled step traces what it always traced, and its package is named as before.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..model.attention import MultiHeadAttention, attention, attention_weights, split_projections

# From this many keys on, one float32 query attends by matmul-softmax-matmul: torch 2.13's fused
# CPU kernel is made for many queries, and for one it took 2.3x the time at 63 keys and 1.6x at
# 16 (200 rows, 8 heads of 64, one thread, an AMD EPYC); at 4 keys it was 2x faster.
ONE_QUERY_KEYS = 16


def step_attention(q: Tensor, k: Tensor, v: Tensor, mask=None, dropout_p: float = 0.0, need_weights: bool = False):
    """:func:`~transformer.model.attention.attention` as a decoding step runs it: one query
    (T_q 1) over :data:`ONE_QUERY_KEYS` keys or more, float32 on a CPU, by its readable form
    (the same result to rounding); anything else as ``attention`` runs it."""
    if (q.size(2) == 1 and k.size(2) >= ONE_QUERY_KEYS and q.dtype == torch.float32 and q.device.type == "cpu"
            and dropout_p == 0.0 and not need_weights and not torch.compiler.is_compiling()):
        return attention_weights(q, k, mask) @ v, None
    return attention(q, k, v, mask, dropout_p, need_weights)


class StepAttend:
    """For a decoding copy's attention classes: :meth:`attend` through :func:`step_attention`
    where it is handed the model's own kernel."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask=None, need_weights: bool = False, kernel=attention):
        return super().attend(q, k, v, mask, need_weights, step_attention if kernel is attention else kernel)


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's linear operator (``torch.ops.mkldnn``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN's matmul (no post-op), on a CPU: any
    leading dimensions, float32 or bfloat16, the weight as it is (no reordered copy)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _eager(x: Tensor, weight: Tensor) -> bool:
    """Whether a call may take oneDNN's operator: eager (not traced), on the CPU, and not
    recording for backward (the operator has no derivative)."""
    return (not torch.compiler.is_compiling() and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)))


class OneDnnLinear(nn.Linear):
    """An ``nn.Linear`` of a decoding copy whose shape measured faster through oneDNN: the
    same parameters, multiplied by :func:`onednn_linear`."""

    def forward(self, x: Tensor) -> Tensor:
        if _eager(x, self.weight):
            return onednn_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class OneDnnProjection:
    """A decoding copy's output projection, logits = h W + b, through oneDNN: W the model's
    (the embedding's, when tied), b its output bias, added in the same call. Set as the copy's
    ``project``; a traced graph calls the model's own."""

    def __init__(self, model: nn.Module) -> None:
        self.weight, self.bias = model.output_layer()
        self.own = model.project  # the class's method, bound to the copy

    def __call__(self, h: Tensor) -> Tensor:
        if _eager(h, self.weight):
            return onednn_linear(h, self.weight, self.bias)
        return self.own(h)


class DecodingAttention(StepAttend, MultiHeadAttention):
    """A decoding copy's attention: the projections it applies together
    (:meth:`~transformer.model.attention.MultiHeadAttention.project_together`) read weights
    concatenated once (``fused``, keyed by the layers), instead of concatenating them at every
    call: at 2 sentences of an opus-mt-sized model that ``cat`` was about a tenth of a step."""

    fused: dict[tuple[int, ...], tuple[Tensor, Tensor | None]]

    def fuse(self, linears) -> None:
        """Concatenate the weights (and biases) of ``linears`` now, for later calls with them."""
        weight = torch.cat([lin.weight.detach() for lin in linears])  # (sum of sizes, C)
        bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
        self.fused[tuple(map(id, linears))] = (weight, bias)

    def project_together(self, x: Tensor, linears) -> list[Tensor]:
        fused = self.fused.get(tuple(map(id, linears)))
        if fused is None or torch.compiler.is_compiling() or (torch.is_grad_enabled() and x.requires_grad):
            return super().project_together(x, linears)
        return split_projections(F.linear(x, *fused), [lin.out_features for lin in linears], self.d_head)


def shallow_copy(module: nn.Module) -> nn.Module:
    """``module`` and every submodule copied, their parameters and buffers the same tensors:
    changing the copy's modules (their children, parameters, buffers, hooks) leaves the
    original's alone, and no weight is duplicated."""
    out = copy.copy(module)
    for key, value in vars(module).items():  # _parameters, _buffers, the hooks' dicts, ...
        if isinstance(value, (dict, set)):
            vars(out)[key] = copy.copy(value)
    out._modules = {name: None if child is None else shallow_copy(child) for name, child in module._modules.items()}
    return out


def prepare(model: nn.Module, onednn: set[tuple[int, int]] = frozenset()) -> nn.Module:
    """In place, on a decoding copy (float32 or bfloat16, eval mode): fused weights for every
    plain attention (:class:`DecodingAttention`), and the linear layers whose (in, out) is in
    ``onednn``, the output projection included, through oneDNN. Returns ``model``."""
    one_bias = getattr(model, "out_proj", None) is None or model.out_proj.bias is None  # (b: the output bias only)
    weight = model.output_layer()[0] if hasattr(model, "output_layer") and one_bias else None
    if isinstance(weight, Tensor) and (weight.size(1), weight.size(0)) in onednn:
        model.project = OneDnnProjection(model)  # (an instance attribute: the class's method stays)
    for name, m in model.named_modules():
        if type(m) is nn.Linear and (m.in_features, m.out_features) in onednn:
            m.__class__ = OneDnnLinear
        if type(m) is MultiHeadAttention:
            m.__class__ = DecodingAttention
            m.fused = {}
            if name.rpartition(".")[2] == "self_attn":  # (a cross-attention projects its q alone)
                m.fuse((m.q_proj, m.k_proj, m.v_proj))
    decoder = getattr(model, "decoder", None)
    if hasattr(decoder, "cross_kv"):  # the memory's K, V: every layer's, in one matmul from the first's attention
        attns = [layer.cross_attn for layer in decoder.layers]
        if isinstance(attns[0], DecodingAttention):
            attns[0].fuse([lin for a in attns for lin in (a.k_proj, a.v_proj)])
    return model
