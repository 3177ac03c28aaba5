"""Decoding precision: float32, bfloat16 weights, or int8 weights.

    auto  bf16 where the device computes it natively (AVX512-BF16 / AMX CPUs, Ampere+ GPUs),
          else fp32 (:func:`transformer.hardware.resolve`); the default
    fp32  the trained weights as they are (the reference)
    bf16  every floating-point parameter and buffer in bfloat16: matmuls run on the CPU's
          bf16 matrix units (AMX / AVX512-BF16) without autocast's per-call weight casts;
          log-probabilities and beam scores stay float32 (``next_token_logprobs``)
    int8  every linear layer, the output projection included, holds int8 weights with one
          float32 scale per output row (:class:`Int8Linear`), multiplied in what the CPU is
          fast at: where bf16 is native, dequantised to bfloat16 (bf16 outputs, so attention
          runs on bf16 queries, keys and values); elsewhere by fbgemm's int8 GEMM (float32
          outputs). Embeddings, LayerNorm and the residual stream stay float32,
          log-probabilities float32 as for bf16

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


def resolve_precision(precision: str, device: str | torch.device = "cpu") -> str:
    """The precision ``precision`` stands for on ``device``: ``auto`` becomes bf16 or fp32
    (:func:`transformer.hardware.resolve`); any other is checked and returned."""
    check_precision(precision, device)
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
    precision = resolve_precision(decoding.precision, decoding.device)
    if warn and (note := hardware.slow_precision_warning(decoding.precision, decoding.device)):
        warnings.warn(note, stacklevel=3)
    return for_inference(model.to(decoding.device), precision), decoding.replace(precision=precision)


def for_inference(model: nn.Module, precision: str = "fp32") -> nn.Module:
    """``model`` in eval mode at ``precision`` (``auto`` resolved for the model's device):
    the model itself when it is already float32 and fp32 is asked for, a converted copy
    otherwise (the caller's model keeps its dtype)."""
    precision = resolve_precision(precision, next(model.parameters()).device)
    if isinstance(model, Ensemble):  # each member on its own: the int8 path rebuilds a member's projection
        return Ensemble([for_inference(m, precision) for m in model.members])
    float32 = all(p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())
    if precision == "fp32" and float32:
        return model.eval()
    out = copy.deepcopy(model).to(torch.bfloat16 if precision == "bf16" else torch.float32).eval()
    if precision != "int8":
        return out
    compute, gemm = int8_compute_dtype(), int8_gemm_available()
    if getattr(out, "out_proj", "absent") is None:  # tied: a projection of its own to quantise
        _own_output_layer(out)
    for parent in list(out.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear.from_linear(child, compute, gemm))
        if type(parent) is MultiHeadAttention:  # (the copy's own module: its int8 form)
            parent.__class__ = Int8Attention
    return out


def int8_compute_dtype() -> torch.dtype:
    """What an int8 layer's weight-only path multiplies in on this CPU: bfloat16 where bf16 is
    native, float32 elsewhere (emulated bf16 would make int8 20x slower than fp32)."""
    return torch.bfloat16 if hardware.cpu_has_native_bf16() else torch.float32


def int8_gemm_available() -> bool:
    """Whether int8 layers multiply with a real int8 GEMM (fbgemm's dynamically quantised
    linear) when decoding eagerly: on CPUs without native bf16, where it measured 2-4x faster
    than fp32 products at decoding batch sizes and the weight-only path (dequantised to fp32)
    slower than fp32 (``benchmarks/decode/README.md``)."""
    return (not hardware.cpu_has_native_bf16() and "fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_dynamic"))


def uses_int8_gemm(model: nn.Module) -> bool:
    """Whether ``model`` has int8 layers that multiply with fbgemm's int8 GEMM (CPUs without
    native bf16). A compiled step cannot call that GEMM: it traces the weight-only path, and
    inductor folds its dequantised weights into float32 constants, so the package holds more
    bytes than an fp32 one and its step measured slower than the eager int8 GEMM
    (``benchmarks/interop/README.md``). Such a model decodes eagerly
    (:meth:`transformer.front_door.FrontDoor.compiles`)."""
    return any(isinstance(m, Int8Linear) and m.int8_gemm for m in model.modules())


class Int8Linear(nn.Module):
    """A linear layer for decoding with int8 weights: ``qweight`` (out, in) int8 and one
    float32 ``scale`` per output row, symmetric (the row's largest |w| maps to 127), and the
    bias. The product runs in what the CPU is fast at:

    - weight-only (``int8_gemm`` False): a call dequantises the weight to ``compute``
      (bfloat16 where the CPU multiplies bf16 natively, else float32; one pass over the int8
      rows, each times its scale) and multiplies the input, cast to that dtype, by it with the
      bias added in the same matmul; the output has that dtype. On an AVX512-BF16 CPU, in
      bf16, this measured level with ``torch.ao``'s dynamically quantised int8 matmul or
      faster, and a bf16 output costs less than a float32 one: at decoding batch sizes an
      extra pass over the (rows x vocabulary) logits costs as much as the matmul.
    - int8 GEMM (``int8_gemm`` True, CPUs without native bf16): fbgemm's dynamically
      quantised linear, the input quantised per call (per tensor, 7 bits, as ``torch.ao``
      does for fbgemm) and multiplied by the same int8 weights with int32 sums; float32
      output. A graph being compiled or exported takes the weight-only path (it traces; the
      packed weights do not).

    The residual stream that sums these outputs, the embeddings and LayerNorm stay float32."""

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None = None,
                 compute: torch.dtype = torch.bfloat16, int8_gemm: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = qweight.size(1), qweight.size(0)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        # what the matmul uses, made once: the scales as a column, the bias, in the compute dtype
        self.register_buffer("_scale_col", scale.to(compute).unsqueeze(1), persistent=False)
        self.register_buffer("_bias", None if bias is None else bias.to(compute), persistent=False)
        self.int8_gemm = int8_gemm
        self._packed = None  # fbgemm's packed weights, made at the first call that uses them

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, compute: torch.dtype = torch.bfloat16,
                    int8_gemm: bool = False) -> "Int8Linear":
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(qweight, scale, bias, compute, int8_gemm)

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
        """The dtype of what this layer outputs: its compute dtype (float32 on the int8 GEMM)."""
        return torch.float32 if self.int8_gemm else self._scale_col.dtype

    def weight(self) -> Tensor:
        """The dequantised float32 weight (out, in). A method, as on ``torch.ao``'s quantised
        layers, so that code stacking plain layers' weight tensors leaves this one alone."""
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        if self.int8_gemm and not torch.compiler.is_compiling():
            packed = self._packed if self._packed is not None else self._pack()
            y = torch.ops.quantized.linear_dynamic(x.reshape(-1, self.in_features).float().contiguous(), packed, True)
            return y.view(*x.shape[:-1], self.out_features)
        w = torch.mul(self.qweight, self._scale_col)  # int8 x bf16 (or fp32) -> (out, in) in that dtype
        return F.linear(x.to(w.dtype), w, self._bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


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
