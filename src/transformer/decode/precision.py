"""Decoding precision: float32, bfloat16 weights, or int8 weights.

    auto  on a CPU, fp32 or bf16, whichever multiplied the model's decoding step faster in a
          short measurement on this machine (:mod:`transformer.decode.choose`, kept in the
          user's cache); on a GPU, or where nothing can be measured, bf16 where the device
          computes it natively, else fp32 (:func:`transformer.hardware.resolve`); the default
    fastest  auto with int8 allowed: on a CPU fp32, bf16 or int8, whichever measured fastest
          (int8's translations differ from fp32's on about a tenth of sentences, so it is
          the user's to allow); elsewhere as auto
    fp32  the trained weights as they are (the reference)
    bf16  every floating-point parameter and buffer in bfloat16: matmuls run on the CPU's
          bf16 matrix units (AMX / AVX512-BF16) without autocast's per-call weight casts;
          log-probabilities and beam scores stay float32 (``next_token_logprobs``)
    int8  every linear layer, the output projection included, holds int8 weights with one
          float32 scale per output row (:class:`Int8Linear`), each multiplied by the kernel
          measured fastest at its shape on this machine (:mod:`transformer.decode.choose`):
          a real int8 GEMM (``torch._int_mm`` on the input quantised per row, or fbgemm's),
          float32 out, or weight-only (dequantised to bf16 or fp32 at every call).
          Embeddings, LayerNorm and the residual stream stay float32, log-probabilities
          float32 as for bf16

Search is unchanged. What each costs in BLEU and buys in speed on this machine is measured
in ``benchmarks/decode/README.md``.
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from .. import hardware
from ..model.attention import MultiHeadAttention
from . import decoding_copy
from .int8 import Int8Attention, Int8Linear
from .decoding_config import PRECISIONS, DecodingConfig, check_precision  # noqa: F401 (PRECISIONS: the choices, named here too)
from .ensemble import Ensemble


FASTEST = "fastest"  # auto, int8 allowed


def resolve_precision(precision: str, device: str | torch.device = "cpu", model: nn.Module | None = None) -> str:
    """The precision ``precision`` stands for on ``device``: ``auto`` becomes fp32 or bf16
    (``fastest``: or int8), for ``model`` on a CPU whichever measured faster there
    (:func:`transformer.decode.choose.auto_precision`), else by the device's flags
    (:func:`transformer.hardware.resolve`); any other is checked and returned."""
    check_precision(precision, device)
    if precision in (hardware.AUTO, FASTEST) and model is not None:
        from .choose import auto_precision

        return auto_precision(model, device, int8=precision == FASTEST)
    return hardware.resolve(hardware.AUTO if precision == FASTEST else precision, device)


def decoding_device(decoding: DecodingConfig, model: nn.Module | None = None) -> str:
    """The device ``decoding.device`` names, ``auto`` resolved: where ``model``'s weights are
    (a model handed over in memory stays where its owner put it), else a CUDA GPU when torch
    sees one, else the CPU; the CPU for int8, which only a CPU computes."""
    if decoding.device != hardware.AUTO:
        return decoding.device
    if decoding.precision == "int8":
        return "cpu"
    weight = next(model.parameters(), None) if model is not None else None
    return str(weight.device) if weight is not None else hardware.resolve_device(hardware.AUTO)


def decoding_model(model: nn.Module, decoding, warn: bool = True):
    """What a Translator or Generator decodes with: ``model`` moved to ``decoding.device``
    (:func:`decoding_device`: ``auto`` leaves it where it is) and
    converted to its precision (``auto`` resolved), and ``decoding`` with the precision it
    resolved to. An explicit bf16 where the CPU emulates it runs as asked, with one line
    saying what it costs (a warning, unless ``warn`` is False: a command prints
    :func:`transformer.hardware.slow_precision_warning` itself)."""
    decoding = decoding.replace(device=decoding_device(decoding, model))
    precision = resolve_precision(decoding.precision, decoding.device, model)
    if warn and (note := hardware.slow_precision_warning(decoding.precision, decoding.device)):
        warnings.warn(note, stacklevel=3)
    return for_inference(model.to(decoding.device), precision), decoding.replace(precision=precision)


def for_inference(model: nn.Module, precision: str = "fp32") -> nn.Module:
    """A copy of ``model`` for decoding, in eval mode, at ``precision`` (``auto`` resolved for
    the model and its device); the caller's model keeps its dtype, mode and modules. fp32 of
    a float32 model: its own weights (shared, not copied), bf16 and int8: converted ones.
    Float copies fuse their attention weights once and multiply each shape measured faster
    through oneDNN there (:mod:`transformer.decode.decoding_copy`); int8: each linear layer
    with the kernel measured fastest at its shape (:func:`transformer.decode.choose.int8_kernels`),
    the projections that read the same input fused (:mod:`transformer.decode.int8_fused`)."""
    precision = resolve_precision(precision, next(model.parameters()).device, model)
    if isinstance(model, Ensemble):  # each member on its own: the int8 path rebuilds a member's projection
        return Ensemble([for_inference(m, precision) for m in model.members])
    float32 = all(p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())
    if precision == "fp32" and float32:  # the model's own weights, modules of the copy's own
        # (never packed: the plain weights are the caller's, so packed ones would be a second copy)
        return decoding_copy.prepare(decoding_copy.shallow_copy(model).eval(), *_onednn_shapes(model, precision)[:1])
    out = copy.deepcopy(model).to(torch.bfloat16 if precision == "bf16" else torch.float32).eval()
    if precision != "int8":  # (the copy's own weights: a packed one replaces the plain one)
        return decoding_copy.prepare(out, *_onednn_shapes(out, precision))
    from .choose import int8_kernels

    if getattr(out, "out_proj", "absent") is None:  # tied: a projection of its own to quantise
        _own_output_layer(out)
    linears = [(parent, name, child) for parent in list(out.modules()) for name, child in parent.named_children()
               if type(child) is nn.Linear]
    kernels = int8_kernels([(child.in_features, child.out_features) for *_, child in linears])
    for parent, name, child in linears:
        setattr(parent, name, Int8Linear.from_linear(child, kernels[child.in_features, child.out_features]))
    for m in out.modules():
        if type(m) is MultiHeadAttention:  # (the copy's own module: its int8 form)
            m.__class__ = Int8Attention
    from .int8_fused import fuse_projections

    return fuse_projections(out)  # each attention's Q, K, V and a gated FFN's up and gate: one int8 layer each


def _onednn_shapes(model: nn.Module, precision: str) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """The (in, out) shapes of ``model``'s decoding step (its layers' and its self-attentions'
    Q, K, V together) that multiply faster through oneDNN than through ``F.linear`` at
    ``precision``, and those of them faster still on a packed weight, as measured on this CPU
    (none elsewhere)."""
    if next(model.parameters()).device.type != "cpu":
        return set(), set()
    from .choose import PACKED, decoder_shapes, float_kernels

    kernels = float_kernels([*decoder_shapes(model), *decoding_copy.fused_shapes(model)], precision)
    return set(kernels), {shape for shape, kernel in kernels.items() if kernel == PACKED}


def uses_int8_gemm(model: nn.Module) -> bool:
    """Whether ``model`` has int8 layers that multiply with an int8 GEMM (``int_mm`` or
    ``fbgemm``). A compiled step calls neither: it traces the weight-only path, and inductor
    folds its dequantised weights into float32 constants, so the package holds more bytes
    than an fp32 one and its step measured slower than the eager int8 GEMM
    (``benchmarks/interop/README.md``). Such a model decodes eagerly
    (:meth:`transformer.inference.front_door.FrontDoor.compiles`)."""
    return any(isinstance(m, Int8Linear) and m.int8_gemm for m in model.modules())


def _own_output_layer(model: nn.Module) -> None:
    """In place, on a decoding copy of a tied model (either kind): an output projection of its
    own (a copy of the embedding it is tied to, the rows an untied projection would hold), to
    quantise."""
    weight = model.output_layer()[0].detach()
    # skip_init: no random initialisation, so building it draws nothing from the global RNG
    # (validation during training decodes through here, and resuming must stay exact)
    model.out_proj = nn.utils.skip_init(nn.Linear, weight.size(1), weight.size(0), bias=False,
                                        dtype=weight.dtype, device=weight.device)
    model.out_proj.weight = nn.Parameter(weight.clone(), requires_grad=False)
