"""Decoding precision: float32, bfloat16 weights, or int8 dynamic quantisation.

    fp32  the trained weights as they are (the reference)
    bf16  every floating-point parameter and buffer in bfloat16: matmuls run on the CPU's
          bf16 matrix units (AMX / AVX512-BF16) without autocast's per-call weight casts;
          log-probabilities and beam scores stay float32 (``next_token_logprobs``)
    int8  ``torch.ao`` dynamic quantisation of every linear layer, the output projection
          included: int8 weights (one scale per output row), activations quantised per
          call; embeddings, LayerNorm and attention stay float32

Search is unchanged. What each costs in BLEU and buys in speed on this machine is measured
in ``benchmarks/decode/README.md`` ("Precision through the command line").
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

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
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao's eager quantisation warns that it is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
        return torch.ao.quantization.quantize_dynamic(out, {nn.Linear: qconfig}, dtype=torch.qint8)


def _own_output_layer(model: nn.Module) -> None:
    """In place, on a decoding copy of a tied model: an output projection of its own (a copy
    of the target embedding, the rows an untied projection would hold), to quantise."""
    weight = model.tgt_embed.weight.detach()
    # skip_init: no random initialisation, so building it draws nothing from the global RNG
    # (validation during training decodes through here, and resuming must stay exact)
    model.out_proj = nn.utils.skip_init(nn.Linear, model.cfg.d_model, weight.size(0), bias=False,
                                        dtype=weight.dtype, device=weight.device)
    model.out_proj.weight = nn.Parameter(weight.clone(), requires_grad=False)
