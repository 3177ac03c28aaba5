"""The int8 layers decoding multiplies with: :class:`Int8Linear` (int8 weights, one scale per
output row, and the kernel it multiplies with: weight-only, ``torch._int_mm`` or fbgemm),
:class:`Int8Attention`, and the checks of what this machine's kernels compute. Below both the
conversion (:mod:`transformer.decode.precision`) and the measurement that picks each layer's
kernel (:mod:`transformer.decode.choose`), which both use them."""
from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import hardware
from ..model.attention import MultiHeadAttention, split_projections
from .decoding_copy import StepAttend


#: How an :class:`Int8Linear` multiplies (:mod:`transformer.decode.choose` measures which is
#: fastest at each layer's shape on the machine at hand):
#:   weight-only-bf16  the weight dequantised to bfloat16 at every call, a bf16 matmul, bf16 out
#:   weight-only-fp32  the same in float32
#:   int_mm            a real int8 GEMM: the input quantised per row at every call, ``torch._int_mm``
#:                     (int8 x int8, int32 sums), rescaled by both scales, float32 out
#:   fbgemm            fbgemm's dynamically quantised linear, the input quantised per row too
#:                     (:func:`fbgemm_rows`), float32 out
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
    - ``fbgemm``: fbgemm's dynamically quantised linear on the same int8 weights, each row of
      the input quantised by its own largest |x| as for ``int_mm`` (:func:`fbgemm_rows`: 8
      bits where the CPU has VNNI, else 7, as ``torch.ao`` does, so that AVX2's 16-bit pair
      sums cannot saturate), the bias added after; float32 output.

    No kernel lets one row's values change another's: a sentence translates the same alone as
    in any batch (fbgemm on its own quantises the whole input by one range: in a batch, by its
    largest value anywhere).

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
        scale = row_max(w).squeeze(1) / 127
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
            self._packed = torch.ops.quantized.linear_prepack(q, None)  # (the bias added after the rows' scales)
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
            y = fbgemm_rows(x.reshape(-1, self.in_features), packed, self.bias, self.reduce_range)
            return y.view(*x.shape[:-1], self.out_features)
        w = torch.mul(self.qweight, self._scale_col)  # int8 x bf16 (or fp32) -> (out, in) in that dtype
        return F.linear(x.to(w.dtype), w, self._bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kernel}")


def row_max(x: Tensor) -> Tensor:
    """Each row's largest |x| of float32 ``x`` (rows, k), (rows, 1): a row of zeros gets the
    smallest normal float, so that dividing by it is no division by zero."""
    return x.abs().amax(dim=1, keepdim=True).clamp_(min=torch.finfo(torch.float32).tiny)


def quantise_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` (rows, k) as int8 (rows, k) and one float32 scale per row, (rows, 1): symmetric,
    the row's largest |x| at 127 (:func:`row_max`)."""
    x = x.float()
    scale = row_max(x).div_(127)
    return torch.round(x / scale).to(torch.int8), scale


def fbgemm_rows(x: Tensor, packed, bias: Tensor | None, reduce_range: bool) -> Tensor:
    """``x`` (rows, in) times fbgemm's ``packed`` int8 weights (packed without a bias), plus
    ``bias``, float32 (rows, out), each row of ``x`` quantised by its own largest |x|. fbgemm
    quantises its whole input by one range, its smallest and largest value: each row is divided
    by its largest |x|, and two rows of +1 and -1 after them fix that range at [-1, 1], whatever
    else is in the batch; the rows' products are then multiplied back by those values."""
    n, k = x.shape
    x = x.float()
    rows = row_max(x)  # (n, 1)
    unit = torch.cat([x / rows, _BOUNDS.expand(2, k)])
    y = torch.ops.quantized.linear_dynamic(unit, packed, reduce_range)[:n]
    return y.mul_(rows) if bias is None else torch.addcmul(bias, y, rows)  # (one pass over the output)


_BOUNDS = torch.tensor([[1.0], [-1.0]])  # the range fbgemm_rows fixes


def int8_matmul(x: Tensor, qweight: Tensor, scale: Tensor) -> Tensor:
    """``x`` (rows, in) times the int8 weights ``qweight`` (out, in) with per-row ``scale``
    (out,) transposed, float32 (rows, out): the input quantised per row (:func:`quantise_rows`),
    ``torch._int_mm`` on the CPU (any shape; the transposed weight read as a view), int32
    sums rescaled by the input row's scale and the weight row's, two passes over the output."""
    xq, x_scale = quantise_rows(x)
    return torch._int_mm(xq, qweight.t()).mul(x_scale).mul_(scale)


class Int8Attention(StepAttend, MultiHeadAttention):
    """A decoding copy's attention whose projections are :class:`Int8Linear` layers, which have
    no weight tensor to stack: the projections it applies together run each on its own, their
    outputs side by side."""

    def project_together(self, x: Tensor, linears) -> list[Tensor]:
        return split_projections(torch.cat([lin(x) for lin in linears], dim=-1),
                                 [lin.out_features for lin in linears], self.d_head)
