"""Attention as a traced graph computes it (compiled decoding's step, training's compiled update)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import masks
from ..model.attention import attention_weights


def graph_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | masks.Causal | None,
                    dropout_p: float = 0.0) -> Tensor:
    """:func:`transformer.model.attention`'s output (B, H, T_q, D) as a graph computes it: on a
    CPU always the matmul-softmax-matmul, whose mask, softmax and sums inductor fuses into its
    own loops, dropout from ``torch.rand`` (traced, unlike the eager mask's ``random_``);
    elsewhere torch's fused kernel (``masks.CAUSAL`` as ``is_causal``: the flash kernel may run)."""
    if q.device.type != "cpu":
        causal = mask is masks.CAUSAL
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, dropout_p=dropout_p,
                                              is_causal=causal)
    weights = attention_weights(q, k, mask)  # (B, H, T_q, T_k)
    if dropout_p > 0:
        weights = weights * ((torch.rand(weights.shape, device=q.device) >= dropout_p).to(weights.dtype)
                             * (1.0 / (1.0 - dropout_p)))
    return weights @ v
