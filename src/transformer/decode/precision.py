"""Decoding precision: float32, bfloat16 weights, or int8 weights.

    auto  on a CPU, fp32 or bf16, whichever multiplied the model's decoding step faster in a
          short measurement on this machine (:mod:`transformer.decode.choose`, kept in the
          user's cache); on a GPU, or where nothing can be measured, bf16 where the device
          computes it natively, else fp32 (:func:`transformer.hardware.resolve`); the default
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
from torch import Tensor, nn
from torch.nn import functional as F

from .. import hardware
from ..model.attention import MultiHeadAttention, split_projections
from .decoding_config import PRECISIONS, DecodingConfig, check_precision  # noqa: F401 (PRECISIONS: the choices, named here too)
from .ensemble import Ensemble


def resolve_precision(precision: str, device: str | torch.device = "cpu", model: nn.Module | None = None) -> str:
    """The precision ``precision`` stands for on ``device``: ``auto`` becomes fp32 or bf16,
    for ``model`` on a CPU whichever measured faster there
    (:func:`transformer.decode.choose.auto_precision`), else by the device's flags
    (:func:`transformer.hardware.resolve`); any other is checked and returned."""
    check_precision(precision, device)
    if precision == hardware.AUTO and model is not None:
        from .choose import auto_precision

        return auto_precision(model, device)
    return hardware.resolve(precision, device)


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
    """``model`` in eval mode at ``precision`` (``auto`` resolved for the model and its
    device): the model itself when it is already float32 and fp32 is asked for, a converted
    copy otherwise (the caller's model keeps its dtype). int8: each linear layer with the
    kernel measured fastest at its shape (:func:`transformer.decode.choose.int8_kernels`), the
    projections that read the same input fused (:mod:`transformer.decode.int8_fused`)."""
    precision = resolve_precision(precision, next(model.parameters()).device, model)
    if isinstance(model, Ensemble):  # each member on its own: the int8 path rebuilds a member's projection
        return Ensemble([for_inference(m, precision) for m in model.members])
    float32 = all(p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())
    if precision == "fp32" and float32:
        return model.eval()
    out = copy.deepcopy(model).to(torch.bfloat16 if precision == "bf16" else torch.float32).eval()
    if precision != "int8":
        return out
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


def uses_int8_gemm(model: nn.Module) -> bool:
    """Whether ``model`` has int8 layers that multiply with an int8 GEMM (``int_mm`` or
    ``fbgemm``). A compiled step calls neither: it traces the weight-only path, and inductor
    folds its dequantised weights into float32 constants, so the package holds more bytes
    than an fp32 one and its step measured slower than the eager int8 GEMM
    (``benchmarks/interop/README.md``). Such a model decodes eagerly
    (:meth:`transformer.inference.front_door.FrontDoor.compiles`)."""
    return any(isinstance(m, Int8Linear) and m.int8_gemm for m in model.modules())


#: How an :class:`Int8Linear` multiplies (:mod:`transformer.decode.choose` measures which is
#: fastest at each layer's shape on the machine at hand):
#:   weight-only-bf16  the weight dequantised to bfloat16 at every call, a bf16 matmul, bf16 out
#:   weight-only-fp32  the same in float32
#:   int_mm            a real int8 GEMM: the input quantised per row at every call, ``torch._int_mm``
#:                     (int8 x int8, int32 sums), rescaled by both scales, float32 out
#:   fbgemm            fbgemm's dynamically quantised linear (the input quantised per tensor),
#:                     float32 out
INT8_KERNELS = ("weight-only-bf16", "weight-only-fp32", "int_mm", "fbgemm")
INT8_GEMMS = ("int_mm", "fbgemm")  # the kernels that quantise the input too


_INT_MM_EXACT: list[bool] = []  # int_mm_exact()'s answer, once a process


def int_mm_exact() -> bool:
    """Whether ``torch._int_mm`` sums int8 products exactly on this CPU. It runs oneDNN's
    kernels, which without VNNI (an AVX2-only CPU, or oneDNN limited to AVX2 as the AVX2
    stand-in does) add the products in saturating 16-bit pairs: sums off by tens of thousands.
    Tried once a process on products at int8's extremes, against the same sums in int32."""
    if not _INT_MM_EXACT:
        g = torch.Generator().manual_seed(0)
        a = (torch.randint(0, 2, (8, 256), generator=g) * 254 - 127).to(torch.int8)  # +-127
        b = (torch.randint(0, 2, (256, 16), generator=g) * 254 - 127).to(torch.int8)
        try:
            exact = torch.equal(torch._int_mm(a, b), a.int() @ b.int())
        except RuntimeError:  # a build without the CPU kernel
            exact = False
        _INT_MM_EXACT.append(exact)
    return _INT_MM_EXACT[0]


def fbgemm_available() -> bool:
    """Whether this torch build has fbgemm's dynamically quantised linear."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


class Int8Linear(nn.Module):
    """A linear layer for decoding with int8 weights: ``qweight`` (out, in) int8 and one
    float32 ``scale`` per output row, symmetric (the row's largest |w| maps to 127), and the
    bias. ``kernel`` (:data:`INT8_KERNELS`) says how it multiplies:

    - weight-only (``weight-only-bf16`` / ``-fp32``): a call dequantises the weight (one pass
      over the int8 rows, each times its scale) and multiplies the input, cast to that dtype,
      by it with the bias added in the same matmul; the output has that dtype. At the demo
      model's width (128) on an AVX512-BF16 CPU, in bf16, this measured level with an int8
      GEMM or faster: the dequantising pass is cheap there, and a bf16 output costs less than
      a float32 one (an extra pass over (rows x vocabulary) logits costs as much as the matmul).
    - ``int_mm``: each row of the input quantised to int8 by its own largest |x| (symmetric),
      ``torch._int_mm`` with the int8 weights (int32 sums), the sums times the row's scale and
      the weight row's scale, the bias added after; float32 output. Where the CPU has VNNI
      (AVX512-VNNI, AVX-VNNI) this is the fastest product at opus-mt widths (512 and up).
      Where its sums are not exact (:func:`int_mm_exact`: oneDNN without VNNI) the layer takes
      fbgemm's GEMM instead.
    - ``fbgemm``: fbgemm's dynamically quantised linear on the same int8 weights (the input
      quantised per tensor: 8 bits where the CPU has VNNI, else 7, as ``torch.ao`` does, so
      that AVX2's 16-bit pair sums cannot saturate); float32 output.

    A graph being compiled or exported takes the weight-only path (float32 for the two int8
    GEMMs, as their outputs are): it traces, and fbgemm's packed weights do not. The residual
    stream that sums these outputs, the embeddings and LayerNorm stay float32."""

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None = None,
                 kernel: str = "weight-only-bf16") -> None:
        super().__init__()
        if kernel not in INT8_KERNELS:
            raise ValueError(f"kernel {kernel!r}: expected one of {', '.join(INT8_KERNELS)}")
        self.in_features, self.out_features = qweight.size(1), qweight.size(0)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        if kernel == "int_mm" and not int_mm_exact():  # its sums would be wrong here: the other int8 GEMM
            kernel = "fbgemm" if fbgemm_available() else "weight-only-fp32"
        compute = torch.bfloat16 if kernel == "weight-only-bf16" else torch.float32
        # what the weight-only matmul uses, made once: the scales as a column, the bias, in its dtype
        self.register_buffer("_scale_col", scale.to(compute).unsqueeze(1), persistent=False)
        self.register_buffer("_bias", None if bias is None else bias.to(compute), persistent=False)
        self.kernel = kernel
        # fbgemm's activations in 7 bits where int8 pairs' sums could saturate (no VNNI), else 8
        self.reduce_range = not hardware.cpu_has_vnni()
        self._packed = None  # fbgemm's packed weights, made at the first call that uses them

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, kernel: str = "weight-only-bf16") -> "Int8Linear":
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(qweight, scale, bias, kernel)

    @property
    def int8_gemm(self) -> bool:
        """Whether this layer multiplies with an int8 GEMM (the input quantised too) when eager."""
        return self.kernel in INT8_GEMMS

    def __deepcopy__(self, memo):  # the packed weights are an opaque object: copy without them
        packed, self._packed = self._packed, None
        try:
            cls = type(self)
            copied = cls.__new__(cls)
            memo[id(self)] = copied
            for key, value in self.__dict__.items():
                copied.__dict__[key] = copy.deepcopy(value, memo)
            return copied
        finally:
            self._packed = packed

    def _pack(self):
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.13 marks quantised tensors deprecated; fbgemm's packing still takes one
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions", category=UserWarning)
            zeros = torch.zeros(self.out_features, dtype=torch.long, device=self.qweight.device)
            q = torch._make_per_channel_quantized_tensor(self.qweight, self.scale.double(), zeros, 0)
            self._packed = torch.ops.quantized.linear_prepack(q, self.bias)
        return self._packed

    @property
    def out_dtype(self) -> torch.dtype:
        """The dtype of what this layer outputs: its compute dtype (float32 on the int8 GEMMs)."""
        return self._scale_col.dtype

    def weight(self) -> Tensor:
        """The dequantised float32 weight (out, in). A method, as on ``torch.ao``'s quantised
        layers, so that code stacking plain layers' weight tensors leaves this one alone."""
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "int_mm" and not torch.compiler.is_compiling():
            y = int8_matmul(x.reshape(-1, self.in_features), self.qweight, self.scale)
            if self.bias is not None:
                y += self.bias
            return y.view(*x.shape[:-1], self.out_features)
        if self.kernel == "fbgemm" and not torch.compiler.is_compiling():
            packed = self._packed if self._packed is not None else self._pack()
            y = torch.ops.quantized.linear_dynamic(x.reshape(-1, self.in_features).float().contiguous(), packed,
                                                   self.reduce_range)
            return y.view(*x.shape[:-1], self.out_features)
        w = torch.mul(self.qweight, self._scale_col)  # int8 x bf16 (or fp32) -> (out, in) in that dtype
        return F.linear(x.to(w.dtype), w, self._bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kernel}")


def quantise_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` (rows, k) as int8 (rows, k) and one float32 scale per row, (rows, 1): symmetric,
    the row's largest |x| at 127 (a row of zeros keeps a tiny scale, not a division by zero)."""
    x = x.float()
    scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=torch.finfo(torch.float32).tiny).div_(127)
    return torch.round(x / scale).to(torch.int8), scale


def int8_matmul(x: Tensor, qweight: Tensor, scale: Tensor) -> Tensor:
    """``x`` (rows, in) times the int8 weights ``qweight`` (out, in) with per-row ``scale``
    (out,) transposed, float32 (rows, out): the input quantised per row (:func:`quantise_rows`),
    ``torch._int_mm`` on the CPU (any shape; the transposed weight read as a view), int32
    sums rescaled by the input row's scale and the weight row's, two passes over the output."""
    xq, x_scale = quantise_rows(x)
    return torch._int_mm(xq, qweight.t()).mul(x_scale).mul_(scale)


class Int8Attention(MultiHeadAttention):
    """A decoding copy's attention whose projections are :class:`Int8Linear` layers, which have
    no weight tensor to stack: the projections it applies together run each on its own, their
    outputs side by side."""

    def project_together(self, x: Tensor, linears) -> list[Tensor]:
        return split_projections(torch.cat([lin(x) for lin in linears], dim=-1),
                                 [lin.out_features for lin in linears], self.d_head)


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
