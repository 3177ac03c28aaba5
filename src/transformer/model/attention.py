"""Scaled dot-product attention and multi-head attention.

Shape legend
    B  batch            H  heads              D  head dim (d_k = d_v = d_model / H)
    S  source length    T  target length      T_q / T_k  query / key length
    C  d_model          V  vocabulary

Masks follow :mod:`transformer.model.masks`: boolean, True = may attend (or ``masks.CAUSAL``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import masks
from .dropout import dropout


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | masks.Causal | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k)) V, a pure function.

    Args:
        q: (B, H, T_q, D); k, v: (B, H, T_k, D)
        mask: bool, broadcastable to (B, H, T_q, T_k), True = may attend; or
            :data:`~transformer.model.masks.CAUSAL` (T_q == T_k, only the future hidden),
            which torch's fused kernel takes as ``is_causal=True`` with no mask tensor.
        dropout_p: dropout on the attention weights (pass 0.0 in eval mode).
        need_weights: also return the weights. Without it, torch's fused kernel runs where
            it is the faster one: on a GPU (where ``is_causal`` lets it pick the flash kernel),
            and on a CPU in float32. (In bf16 / fp16 it was 1.5-7x slower on a CPU than the
            matmul-softmax-matmul below, forward + backward, at translation-sized shapes:
            torch 2.13 on an AVX512-BF16 CPU, benchmarks/training.md.)

    Returns:
        output (B, H, T_q, D) and weights (B, H, T_q, T_k) or None.
        A query whose keys are all masked gets all-zero weights and a zero output
        (finite forward and backward), in both paths.
    """
    causal = mask is masks.CAUSAL
    if not need_weights and (q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16)):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, dropout_p=dropout_p,
                                             is_causal=causal)
        return out, None
    weights = attention_weights(q, k, mask)
    used = dropout(weights, dropout_p) if dropout_p > 0 else weights
    return used @ v, (weights if need_weights else None)


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | masks.Causal | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)): (B, H, T_q, T_k), each query's weights over the keys (q, k
    and mask as in :func:`attention`); a query whose keys are all masked gets zeros."""
    if mask is masks.CAUSAL:
        mask = masks.CAUSAL.tensor(q.size(-2), k.size(-2), q.device)  # (1, 1, T, T)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a fully masked row would otherwise be uniform over padding
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The h per-head matrices W_i^Q (C x D) are stored side by side as one C x C linear
    layer ``q_proj`` (likewise ``k_proj``, ``v_proj``); ``out_proj`` is W^O.
    """

    def __init__(self, d_model: int, n_heads: int, attn_dropout: float = 0.0, n_kv_heads: int | None = None,
                 bias: bool = True, qkv_bias: bool | None = None) -> None:
        super().__init__()
        qkv_bias = bias if qkv_bias is None else qkv_bias  # Qwen2: biases on q, k, v only
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads  # < n_heads: grouped-query attention
        self.d_head = d_model // n_heads
        self.attn_dropout = attn_dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.d_head, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.d_head, bias=qkv_bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, D)

    def merge_heads(self, x: Tensor) -> Tensor:
        """Concat(head_1, ..., head_h): (B, H, T, D) -> (B, T, H * D), split_heads undone."""
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head)

    def expand_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """K, V (B, H_kv, T_k, D) -> (B, H, T_k, D): under grouped-query attention each K/V
        head serves n_heads / n_kv_heads query heads."""
        if self.n_kv_heads == self.n_heads:
            return k, v
        group = self.n_heads // self.n_kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, C) -> Q (B, H, T, D), K and V (B, H_kv, T, D), for self-attention: one
        matmul with the three weight matrices side by side, which runs faster than three."""
        return tuple(self.project_together(x, (self.q_proj, self.k_proj, self.v_proj)))

    def project_together(self, x: Tensor, linears) -> list[Tensor]:
        """``linears`` (of this attention, or others with its head size that read the same
        ``x``) applied to ``x`` as one matmul: :func:`fused_projection`."""
        return fused_projection(x, linears, self.d_head)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                need_weights: bool = False, kernel=attention) -> tuple[Tensor, Tensor | None]:
        """Attend from queries ``x`` (B, T_q, C) to projected ``k``, ``v`` (B, H, T_k, D).

        Returns (B, T_q, C) and, on request, the weights (B, H, T_q, T_k).
        """
        return self.attend(self.split_heads(self.q_proj(x)), k, v, mask, need_weights, kernel)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | masks.Causal | None = None,
               need_weights: bool = False, kernel=attention) -> tuple[Tensor, Tensor | None]:
        """Attention of projected ``q`` (B, H, T_q, D) over ``k``, ``v``, then the heads
        concatenated and projected by W^O: (B, T_q, C) and the weights or None. ``kernel``:
        :func:`attention`, or another form of it taking and giving what it does."""
        p = self.attn_dropout if self.training else 0.0
        k, v = self.expand_kv(k, v)  # (B, H, T_k, D)
        out, weights = kernel(q, k, v, mask, p, need_weights)  # (B, H, T_q, D)
        return self.out_proj(self.merge_heads(out)), weights  # (B, T_q, C)


def fused_projection(x: Tensor, linears, d_head: int) -> list[Tensor]:
    """Apply several linear layers to the same ``x`` (B, T, C) as one matmul, and split each
    result into heads of size ``d_head``: a list of (B, H_i, T, D), one per layer, in order.

    The weights stay separate parameters (checkpoints see ``q_proj``, ``k_proj``, ...);
    only the matmul is shared. One (C x nC) product uses the CPU's matrix units much better
    than n small (C x C) ones, forward and backward.
    """
    weight = torch.cat([lin.weight for lin in linears])  # (sum of sizes, C)
    bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    return split_projections(F.linear(x, weight, bias), [lin.out_features for lin in linears], d_head)


def split_projections(y: Tensor, sizes: list[int], d_head: int) -> list[Tensor]:
    """(B, T, sum of sizes) outputs of projections side by side -> one (B, H_i, T, D) per
    projection, in order."""
    b, t, _ = y.shape
    return [part.view(b, t, n // d_head, d_head).transpose(1, 2) for part, n in zip(y.split(sizes, -1), sizes)]
