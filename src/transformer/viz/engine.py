"""The walkthrough engine: a model's layers run one sub-layer at a time, keeping what each
computed, for both model kinds (the translation model's encoder and decoder, a language
model's decoder-only stack).

Every piece calls the model's own parts: ``project_qkv`` / ``q_proj``, the
pure :func:`~transformer.model.attention.attention` asked for its weights, ``expand_kv``,
``merge_heads`` and ``out_proj``, the norms and the FFN's linear layers. Only the glue between
them is repeated here, in the order of :class:`~transformer.model.layers.SublayerConnection`,
``EncoderLayer`` and ``DecoderLayer``, so a walkthrough's outputs equal the model's
explicit-attention path bit for bit (each walkthrough records that check).

Shape legend: T_q / T_k query / key positions, H heads, H_kv key/value heads, D = d_k head
dim, C = d_model, d_ff the FFN's inner width.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn.functional as F
from torch import Tensor

from ..model.attention import attention
from ..model.rotary import apply_rotary


@dataclass
class AttentionParts:
    """One multi-head attention of one sequence, opened up."""

    q: Tensor  # (1, H, T_q, D) the queries (rotated, with RoPE)
    k: Tensor  # (1, H, T_k, D) the keys (rotated; repeated for each query head under grouped-query attention)
    v: Tensor  # (1, H, T_k, D)
    raw_scores: Tensor  # (1, H, T_q, T_k) Q K^T, before the scaling and the mask
    weights: Tensor  # (1, H, T_q, T_k) softmax(Q K^T / sqrt(d_k) + M)
    concat: Tensor  # (1, T_q, H * D) the heads side by side
    out: Tensor  # (1, T_q, C) concat W_O
    unrotated: tuple[Tensor, Tensor] | None = None  # RoPE only: q (1, H, T, D), k (1, H_kv, T, D) before turning


def open_attention(mha, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> AttentionParts:
    """MultiHeadAttention.attend on projected q (1, H, T_q, D), k, v (1, H_kv, T_k, D),
    keeping the weights and the concatenated heads. ``mask``: bool, True = may attend."""
    k, v = mha.expand_kv(k, v)  # (1, H, T_k, D)
    heads, weights = attention(q, k, v, mask, need_weights=True)  # (1, H, T_q, D), (1, H, T_q, T_k)
    concat = mha.merge_heads(heads)  # (1, T_q, H * D)
    raw = q @ k.transpose(-2, -1)  # (1, H, T_q, T_k): only for step 3a's numbers
    return AttentionParts(q, k, v, raw, weights, concat, mha.out_proj(concat))


def self_attention(mha, h: Tensor, mask: Tensor | None, rotary: tuple[Tensor, Tensor] | None = None) -> AttentionParts:
    """Self-attention of ``h`` (1, T, C) as the layers run it: Q, K, V in one matmul, then
    (RoPE) q and k turned by ``rotary``'s cos, sin."""
    q, k, v = mha.project_qkv(h)  # (1, H, T, D), K and V (1, H_kv, T, D)
    if rotary is None:
        return open_attention(mha, q, k, v, mask)
    parts = open_attention(mha, apply_rotary(q, *rotary), apply_rotary(k, *rotary), v, mask)
    parts.unrotated = (q, k)
    return parts


def sublayer(block, x: Tensor, run: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """SublayerConnection.forward: returns (new x, the residual sum, the sub-layer output)."""
    if block.norm_first:
        y = run(block.norm(x))
        s = x + y
        return s, s, y
    y = run(x)
    s = x + y
    return block.norm(s), s, y


def ffn_parts(ffn, x: Tensor) -> dict[str, Tensor]:
    """FeedForward.forward on x (1, T, C), keeping "up" (x W_up) and "gate" (x W_gate) of a
    gated FFN, "hidden" (1, T, d_ff) after the activation, and "out" (1, T, C)."""
    if ffn.gate is not None:
        up, gate = ffn.fc1(x), ffn.gate(x)
        hidden = up * F.silu(gate)  # FeedForward.hidden's order of operations
        return {"up": up, "gate": gate, "hidden": hidden, "out": ffn.fc2(hidden)}
    hidden = ffn.hidden(x)
    return {"hidden": hidden, "out": ffn.fc2(hidden)}


def run_layer(layer, x: Tensor, self_mask: Tensor | None, rotary=None, cross_kv=None, memory_mask=None):
    """EncoderLayer.forward or DecoderLayer.forward on x (1, T, C), sub-layer by sub-layer.

    Args:
        self_mask: the self-attention's mask (padding for the encoder, causal for a decoder).
        rotary: cos, sin of the positions (RoPE), or None.
        cross_kv: a translation decoder's K, V (1, H, S, D) of the memory; None otherwise.
        memory_mask: (1, 1, 1, S) the source mask for the cross-attention.

    Returns:
        the new x (1, T, C) and the parts: "x_in", "self" (:class:`AttentionParts`), "self_sum"
        (x + attention output), "self_out" (the attention output), "cross" (translation decoder),
        "ffn" (:func:`ffn_parts`), "ffn_sum".
    """
    parts = {"x_in": x}

    def attend_self(h: Tensor) -> Tensor:
        parts["self"] = self_attention(layer.self_attn, h, self_mask, rotary)
        return parts["self"].out

    def attend_memory(h: Tensor) -> Tensor:
        mha = layer.cross_attn
        parts["cross"] = open_attention(mha, mha.split_heads(mha.q_proj(h)), *cross_kv, memory_mask)
        return parts["cross"].out

    def feed_forward(h: Tensor) -> Tensor:
        parts["ffn"] = ffn_parts(layer.ffn, h)
        return parts["ffn"]["out"]

    self_block = layer.attn_block if hasattr(layer, "attn_block") else layer.self_block  # encoder / decoder
    x, parts["self_sum"], parts["self_out"] = sublayer(self_block, x, attend_self)
    if cross_kv is not None:
        x, _, _ = sublayer(layer.cross_block, x, attend_memory)
    x, parts["ffn_sum"], _ = sublayer(layer.ffn_block, x, feed_forward)
    return x, parts


def run_stack(layers, x: Tensor, self_mask: Tensor | None, rotary=None, cross_kv=None,
              memory_mask=None) -> tuple[Tensor, list[dict]]:
    """Encoder.forward or Decoder.forward's loop (without the final norm): returns the last
    layer's output (1, T, C) and each layer's parts (:func:`run_layer`, plus "x_out", the
    layer's output). ``cross_kv``: one (K, V) per layer, or None."""
    every = []
    for n, layer in enumerate(layers):
        x, parts = run_layer(layer, x, self_mask, rotary, None if cross_kv is None else cross_kv[n], memory_mask)
        parts["x_out"] = x
        every.append(parts)
    return x, every


# ---- text and JSON -------------------------------------------------------------------------

def format_steps(steps: list) -> list[str]:
    """Each step as a block of text lines (title, formula, code, shapes, numbers), then a blank."""
    out = []
    for s in steps:
        out.append(f"({s.number}) {s.title_zh} / {s.title}")
        out.append(f"    formula: {s.formula}")
        out.append(f"    code:    {s.code}")
        out += [f"    shape:   {line}" for line in s.shapes]
        out += [f"    {line}" for line in s.lines]
        out.append("")
    return out


def step_dicts(steps: list) -> list[dict]:
    return [{"step": s.number, "title": s.title, "title_zh": s.title_zh, "formula": s.formula,
             "code": s.code, "shapes": s.shapes, "numbers": s.numbers} for s in steps]
