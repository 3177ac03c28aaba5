"""The copy of a float model that decoding runs: the model's own weights (shared, not copied)
and modules of its own, so that what only decoding wants (weights concatenated once, a
faster kernel) stays out of the model the caller holds and out of ``model/``.

    grouped       under grouped-query attention a step's queries attend to each K, V head as
                  its group, without copies of K, V (:func:`grouped_attend`)
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
    prepacked     the same, with the weight reordered once into oneDNN's blocked layout
                  (:func:`pack`), where that measured faster still (bf16 at Qwen2-0.5B's
                  shapes: 1.4-1.7x ``F.linear`` at 1 to 16 rows on an AMD EPYC with
                  AVX512-BF16). Only in a copy that owns its weights (bf16): the packed weight
                  replaces the layer's plain one (:class:`PackedLinear`), so memory does not
                  grow; in an fp32 copy the plain weights are the caller's model's, and a packed
                  copy would add them again. The output projection's packed weight is a copy:
                  its plain weight stays for the embedding it is tied to, the shortlist's
                  slices and ``output_layer``

A graph being compiled or exported takes the model's own path (``torch.compiler.is_compiling``):
the compiled step traces what it always traced, and its package is named as before; a copy
with packed layers gets its plain weights back first (:func:`unpack`, called by
:func:`transformer.compiled.step`), the same numbers.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..model import masks
from ..model.attention import MultiHeadAttention, attention, attention_weights, split_projections

# From this many keys on, one float32 query attends by matmul-softmax-matmul: torch 2.13's fused
# CPU kernel is made for many queries, and for one it took 2.3x the time at 63 keys and 1.6x at
# 16 (200 rows, 8 heads of 64, one thread, an AMD EPYC); at 4 keys it was 2x faster.
ONE_QUERY_KEYS = 16


def step_attention(q: Tensor, k: Tensor, v: Tensor, mask=None, dropout_p: float = 0.0, need_weights: bool = False):
    """:func:`~transformer.model.attention.attention` as a decoding step runs it: one query
    (T_q 1) over :data:`ONE_QUERY_KEYS` keys or more, float32 on a CPU, by its readable form
    (the same result to rounding), where K is contiguous (the cache's; the memory's K, heads
    split from one projection, would be copied transposed at every step: 1 ms a call at 100
    rows of the demo model, more than the kernel); anything else as ``attention`` runs it."""
    if (q.size(2) == 1 and k.size(2) >= ONE_QUERY_KEYS and q.dtype == torch.float32 and q.device.type == "cpu"
            and k.is_contiguous() and dropout_p == 0.0 and not need_weights and not torch.compiler.is_compiling()):
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


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of ``dtype`` here (bf16 needs AVX512-BF16 or AVX-NE-CONVERT
    and is refused under an ISA limit below them: the AVX2 stand-in)."""
    return onednn_available() and (dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported())


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN's matmul (no post-op), on a CPU: any
    leading dimensions, float32 or bfloat16, the weight as it is (no reordered copy)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


#: the rows oneDNN is told to expect when it packs a weight (its layout's hint; measured level
#: with packing for the call's own rows at 1 to 128 rows in bf16)
PACK_ROWS = 16


def pack(weight: Tensor) -> Tensor:
    """``weight`` (out, in) reordered once into oneDNN's blocked layout for
    :func:`onednn_linear` (an opaque ``torch._mkldnn`` tensor: ``.to_dense()`` gives the
    weight back, bit for bit); the products are oneDNN's on the plain weight, bit for bit."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


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


class PackedLinear(OneDnnLinear):
    """An ``nn.Linear`` of a decoding copy that owns its weights (bf16) whose shape measured
    fastest through oneDNN with the weight packed (:func:`pack`): it holds the packed weight
    instead of the plain one (``packed``; ``weight`` reads it back, plain, at each access, for
    the rare reader: a graph traced or recorded for backward, :func:`unpack`)."""

    packed: Tensor

    @property
    def weight(self) -> Tensor:  # (a class attribute: found before nn.Module's parameter lookup)
        return self.packed.to_dense()

    def forward(self, x: Tensor) -> Tensor:
        if _eager(x, self.packed):
            return onednn_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)


def _pack_linear(m: nn.Linear) -> None:
    """In place: ``m`` a :class:`PackedLinear`, its plain weight dropped."""
    packed = pack(m.weight)
    del m._parameters["weight"]
    m.__class__ = PackedLinear
    m.packed = packed


class OneDnnProjection:
    """A decoding copy's output projection, logits = h W + b, through oneDNN: W the model's
    (the embedding's, when tied), b its output bias, added in the same call; W packed once
    (``packed``, a copy: the plain W stays for the embedding and ``output_layer``) where that
    measured faster. Set as the copy's ``project``; a traced graph calls the model's own."""

    def __init__(self, model: nn.Module, packed: bool = False) -> None:
        self.weight, self.bias = model.output_layer()
        self.packed = pack(self.weight) if packed else None
        self.own = model.project  # the class's method, bound to the copy

    def __call__(self, h: Tensor) -> Tensor:
        if _eager(h, self.weight):
            return onednn_linear(h, self.weight if self.packed is None else self.packed, self.bias)
        return self.own(h)


class GroupedAttend(StepAttend):
    """For a decoding copy's attention classes that attend under grouped-query attention
    without copies of K, V (:func:`grouped_attend`) where it applies, else as
    :class:`StepAttend` does."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | masks.Causal | None = None,
               need_weights: bool = False, kernel=attention) -> tuple[Tensor, Tensor | None]:
        out = grouped_attend(self, q, k, v, mask, need_weights, kernel)
        return super().attend(q, k, v, mask, need_weights, kernel) if out is None else (out, None)


class DecodingAttention(GroupedAttend, MultiHeadAttention):
    """A decoding copy's attention: the projections it applies together
    (:meth:`~transformer.model.attention.MultiHeadAttention.project_together`) read weights
    concatenated once (``fused``, keyed by the layers), instead of concatenating them at every
    call: at 2 sentences of an opus-mt-sized model that ``cat`` was about a tenth of a step."""

    fused: dict[tuple[int, ...], tuple[Tensor, Tensor | None]]

    def fuse(self, linears, packed: bool = False) -> None:
        """Concatenate the weights (and biases) of ``linears`` now, for later calls with them;
        ``packed``: the concatenation packed for oneDNN (:func:`pack`), where its shape measured
        faster so."""
        weight = torch.cat([lin.weight.detach() for lin in linears])  # (sum of sizes, C)
        bias = None if linears[0].bias is None else torch.cat([lin.bias.detach() for lin in linears])
        self.fused[tuple(map(id, linears))] = (pack(weight) if packed else weight, bias)

    def project_together(self, x: Tensor, linears) -> list[Tensor]:
        fused = self.fused.get(tuple(map(id, linears)))
        if fused is None or torch.compiler.is_compiling() or (torch.is_grad_enabled() and x.requires_grad):
            return super().project_together(x, linears)
        weight, bias = fused
        y = onednn_linear(x, weight, bias) if weight.is_mkldnn else F.linear(x, weight, bias)
        return split_projections(y, [lin.out_features for lin in linears], self.d_head)


def fused_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(in, out) of each self-attention's Q, K, V as :func:`prepare` concatenates them: a
    product a float decoding step runs that is no layer's own shape."""
    return [(m.q_proj.in_features, m.q_proj.out_features + m.k_proj.out_features + m.v_proj.out_features)
            for name, m in model.named_modules()
            if isinstance(m, MultiHeadAttention) and name.rpartition(".")[2] == "self_attn"]


def grouped_attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask, need_weights: bool,
                   kernel) -> Tensor | None:
    """A decoding step's attention under grouped-query attention without copying each K, V head
    to the query heads it serves (:meth:`MultiHeadAttention.expand_kv`): one new position a row,
    the ``group`` queries that share a head attend as that head's ``group`` positions (each
    query's softmax is its own), projected by W^O: (B, 1, C). None where that does not apply
    (no groups, several positions, weights wanted, training). The copies grow with the cache:
    at 8 rows and 150 positions 110 MB a step for a Qwen2-0.5B shape."""
    group = attn.n_heads // attn.n_kv_heads
    if group == 1 or q.size(2) != 1 or need_weights or attn.training or mask is masks.CAUSAL \
            or (mask is not None and mask.size(-2) != 1):
        return None
    b, _, _, d = q.shape  # (B, H, 1, D): query head h reads K, V head h // group
    out, _ = kernel(q.reshape(b, attn.n_kv_heads, group, d), k, v, mask)  # mask (B, 1, 1, T_k)
    return attn.out_proj(attn.merge_heads(out.reshape(b, attn.n_heads, 1, d)))


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


def prepare(model: nn.Module, onednn: set[tuple[int, int]] = frozenset(),
            packed: set[tuple[int, int]] = frozenset()) -> nn.Module:
    """In place, on a decoding copy (float32 or bfloat16, eval mode): fused weights for every
    plain attention (:class:`DecodingAttention`), and the linear layers whose (in, out) is in
    ``onednn``, the output projection included, through oneDNN; of those, the ones also in
    ``packed`` with their weights packed (:class:`PackedLinear`: only for a copy that owns its
    weights, whose plain weights nothing else holds). Returns ``model``."""
    one_bias = getattr(model, "out_proj", None) is None or model.out_proj.bias is None  # (b: the output bias only)
    weight = model.output_layer()[0] if hasattr(model, "output_layer") and one_bias else None
    if isinstance(weight, Tensor) and (shape := (weight.size(1), weight.size(0))) in onednn:
        # (an instance attribute: the class's method stays)
        model.project = OneDnnProjection(model, packed=shape in packed and onednn_packs(weight.dtype))
    out_proj = getattr(model, "out_proj", None)
    for name, m in list(model.named_modules()):
        shape = (m.in_features, m.out_features) if type(m) is nn.Linear else None
        if shape in onednn:
            if shape in packed and m is not out_proj and onednn_packs(m.weight.dtype):
                _pack_linear(m)  # (the untied projection keeps its plain weight: output_layer, shortlists)
            else:
                m.__class__ = OneDnnLinear
        if type(m) is MultiHeadAttention:
            m.__class__ = DecodingAttention
            m.fused = {}
            if name.rpartition(".")[2] == "self_attn":  # (a cross-attention projects its q alone)
                qkv = (m.q_proj, m.k_proj, m.v_proj)
                shape = (m.q_proj.in_features, sum(lin.out_features for lin in qkv))
                m.fuse(qkv, packed=shape in onednn and shape in packed and onednn_packs(m.q_proj.weight.dtype))
    decoder = getattr(model, "decoder", None)
    if hasattr(decoder, "cross_kv"):  # the memory's K, V: every layer's, in one matmul from the first's attention
        attns = [layer.cross_attn for layer in decoder.layers]
        if isinstance(attns[0], DecodingAttention):
            attns[0].fuse([lin for a in attns for lin in (a.k_proj, a.v_proj)])
    return model


def unpack(model: nn.Module) -> nn.Module:
    """In place: every packed weight of a decoding copy plain again (the same numbers, through
    oneDNN's unpacked operator), for a graph that is traced, exported and hashed from the
    module's parameters (:func:`transformer.compiled.step`). Returns ``model``."""
    for m in model.modules():
        if type(m) is PackedLinear:
            weight = nn.Parameter(m.weight, requires_grad=False)  # (the property: the packed weight read back)
            del m.packed
            m.__class__ = OneDnnLinear
            m._parameters = {"weight": weight, **m._parameters}  # (nn.Linear's order: named as before)
        if isinstance(m, DecodingAttention):
            m.fused = {k: (w.to_dense() if w.is_mkldnn else w, b) for k, (w, b) in m.fused.items()}
    if isinstance(vars(model).get("project"), OneDnnProjection):
        model.project.packed = None
    return model


def named_weights(model: nn.Module):
    """``model.named_parameters()``, a packed weight read back plain where its parameter was
    (:class:`PackedLinear`): what a compiled step's package is named from, the same before
    and after :func:`unpack`."""
    seen = set()
    for prefix, m in model.named_modules():
        if type(m) is PackedLinear:  # (a weight of its own, never shared)
            yield (f"{prefix}.weight" if prefix else "weight"), m.weight
        for name, p in m._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                yield (f"{prefix}.{name}" if prefix else name), p


def packed_tensors(model: nn.Module) -> list[Tensor]:
    """The packed weights of ``model``'s :class:`PackedLinear` layers (what tells a weights
    version apart besides the parameters)."""
    return [m.packed for m in model.modules() if type(m) is PackedLinear]
