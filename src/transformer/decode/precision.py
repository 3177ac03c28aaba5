"""Decoding precision: float32, bfloat16 weights, or int8 weights.

    fp32  the trained weights as they are (the reference)
    bf16  every floating-point parameter and buffer in bfloat16: matmuls run on the CPU's
          bf16 matrix units (AMX / AVX512-BF16) without autocast's per-call weight casts;
          log-probabilities and beam scores stay float32 (``next_token_logprobs``)
    int8  every linear layer, the output projection included, holds int8 weights with one
          float32 scale per output row (:class:`Int8Linear`, weight-only): each call
          dequantises them to bfloat16 and multiplies in bf16, giving bf16 outputs (so
          attention runs on bf16 queries, keys and values); embeddings, LayerNorm and the
          residual stream stay float32, log-probabilities float32 as for bf16

Search is unchanged. What each costs in BLEU and buys in speed on this machine is measured
in ``benchmarks/decode/README.md``.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .ensemble import Ensemble

PRECISIONS = ("fp32", "bf16", "int8")


def check_precision(precision: str, device: str | torch.device = "cpu") -> None:
    """ValueError unless ``precision`` is one of :data:`PRECISIONS` and suits ``device``
    (bf16 and int8 are CPU decoding options)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "fp32" and torch.device(device).type != "cpu":
        raise ValueError(f"precision {precision} is for CPU decoding; use fp32 with device {device}")


def for_inference(model: nn.Module, precision: str = "fp32") -> nn.Module:
    """``model`` in eval mode at ``precision``: the model itself when it is already float32
    and fp32 is asked for, a converted copy otherwise (the caller's model keeps its dtype)."""
    check_precision(precision, next(model.parameters()).device)
    if isinstance(model, Ensemble):  # each member on its own: the int8 path rebuilds a member's projection
        return Ensemble([for_inference(m, precision) for m in model.members])
    float32 = all(p.dtype == torch.float32 for p in model.parameters() if p.is_floating_point())
    if precision == "fp32" and float32:
        return model.eval()
    out = copy.deepcopy(model).to(torch.bfloat16 if precision == "bf16" else torch.float32).eval()
    if precision != "int8":
        return out
    if getattr(out, "out_proj", "absent") is None:  # tied: a projection of its own to quantise
        _own_output_layer(out)
    for parent in list(out.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear.from_linear(child))
    return out


class Int8Linear(nn.Module):
    """A linear layer for decoding with int8 weights: ``qweight`` (out, in) int8 and one
    float32 ``scale`` per output row, symmetric (the row's largest |w| maps to 127), and the
    bias. Weight-only: a call dequantises the weight to bfloat16 (one pass over the int8
    rows, each times its scale) and multiplies the input, cast to bfloat16, by it with the
    bias added in the same matmul; the output is bfloat16, like a bf16 model's.

    On this CPU (AVX512-BF16) it measured level with ``torch.ao``'s dynamically quantised
    int8 matmul, which it replaces, or faster, and faster than torchao's int8 configs; a bf16
    output costs less than one of float32: at decoding batch sizes an extra pass over the
    (rows x vocabulary) logits costs as much as the matmul (``benchmarks/decode/README.md``). The residual stream that sums these outputs, the
    embeddings and LayerNorm stay float32."""

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = qweight.size(1), qweight.size(0)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        # what the matmul uses, made once: the scales as a bf16 column, the bias in bf16
        self.register_buffer("_scale_col", scale.to(torch.bfloat16).unsqueeze(1), persistent=False)
        self.register_buffer("_bias", None if bias is None else bias.to(torch.bfloat16), persistent=False)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        qweight = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(qweight, scale, bias)

    def weight(self) -> Tensor:
        """The dequantised float32 weight (out, in). A method, as on ``torch.ao``'s quantised
        layers, so that code stacking plain layers' weight tensors leaves this one alone."""
        return self.qweight.float() * self.scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        w = torch.mul(self.qweight, self._scale_col)  # int8 x bf16 -> bf16 (out, in)
        return F.linear(x.to(w.dtype), w, self._bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _own_output_layer(model: nn.Module) -> None:
    """In place, on a decoding copy of a tied model: an output projection of its own (a copy
    of the target embedding, the rows an untied projection would hold), to quantise."""
    weight = model.tgt_embed.weight.detach()
    # skip_init: no random initialisation, so building it draws nothing from the global RNG
    # (validation during training decodes through here, and resuming must stay exact)
    model.out_proj = nn.utils.skip_init(nn.Linear, model.cfg.d_model, weight.size(0), bias=False,
                                        dtype=weight.dtype, device=weight.device)
    model.out_proj.weight = nn.Parameter(weight.clone(), requires_grad=False)
