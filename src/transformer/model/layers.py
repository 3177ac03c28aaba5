"""Encoder and decoder layers: attention and feed-forward sub-layers with Add & Norm.

Post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
Pre-norm  (option):     x = x + Dropout(Sublayer(LayerNorm(x)))
Masks: boolean, True = may attend (see :mod:`transformer.model.masks`).

Each layer's wiring (which sub-layer comes first, each inside its residual connection and norm)
is written once, in its ``sublayers`` method: its own ``forward`` passes the paper's attention,
and whoever computes attention another way (the trace that keeps every value, a step on
fixed-size buffers) passes its own sub-layers to the same wiring.
"""
from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from . import masks
from .attention import MultiHeadAttention, attention
from .dropout import Dropout
from .rotary import apply_rotary


def make_norm(cfg: ModelConfig) -> nn.Module:
    """LayerNorm (the paper, GPT) or RMSNorm (Llama: no centring, no bias), per ``cfg.norm``."""
    if cfg.norm == "rms":
        return nn.RMSNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)


def make_attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, cfg.n_kv_heads, cfg.bias,
                              cfg.bias or cfg.qkv_bias)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, or the gated SwiGLU variant
    (x W_up * silu(x W_gate)) W_down that Llama uses (three matrices).

    ``fc1`` is W1 (W_up), ``fc2`` is W2 (W_down), ``gate`` is W_gate."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.activation = cfg.ffn_activation
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.ffn_activation == "swiglu" else None

    def hidden(self, x: Tensor) -> Tensor:
        """The inner layer after its activation: (B, T, C) -> (B, T, d_ff)."""
        h = self.fc1(x)
        if self.gate is not None:
            return h * F.silu(self.gate(x))
        if self.activation == "relu":
            return F.relu(h)
        if self.activation == "gelu":
            return F.gelu(h)
        if self.activation == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        return F.silu(h)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.hidden(x))


def untapped(name: str, value: Tensor) -> Tensor:  # noqa: ARG001
    """The default ``tap`` of a layer's wiring: every value passes as it is."""
    return value


Tap = Callable[[str, Tensor], Tensor]
Sublayer = Callable[[Tensor], tuple[Tensor, object]]


class SublayerConnection(nn.Module):
    """Residual connection and LayerNorm around one sub-layer (post- or pre-norm)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: Tensor, sublayer: Sublayer, tap: Tap = untapped, name: str = ""):
        """Returns (new x, whatever else the sub-layer returned). ``tap`` sees, and may
        replace, what the sub-layer reads (``name``.in) and the residual sum (``name``.sum)."""
        if self.norm_first:
            y, extra = sublayer(tap(f"{name}.in", self.norm(x)))
            return tap(f"{name}.sum", x + self.dropout(y)), extra
        y, extra = sublayer(tap(f"{name}.in", x))
        return self.norm(tap(f"{name}.sum", x + self.dropout(y))), extra


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = make_attention(cfg)
        self.ffn = FeedForward(cfg)
        self.attn_block = SublayerConnection(cfg)
        self.ffn_block = SublayerConnection(cfg)

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False):
        """x (B, S, C), mask (B, 1, 1, S) -> (B, S, C), self-attention weights (B, H, S, S) or None."""

        def self_attention(h: Tensor):
            q, k, v = self.self_attn.project_qkv(h)  # (B, H, S, D) each
            return self.self_attn.attend(q, k, v, mask, need_weights)

        return self.sublayers(x, self_attention)

    def sublayers(self, x: Tensor, self_attention: Sublayer, feed_forward: Sublayer | None = None,
                  tap: Tap = untapped):
        """The layer's wiring: self-attention, then the FFN (default: this layer's), each a
        function of the sub-layer's input h (B, S, C) -> (output (B, S, C), anything) inside
        its Add & Norm. ``tap(name, value)`` sees, and may replace, each value on the way:
        "resid_pre" (the layer's input), "attn.in", "attn.sum", "resid_mid", "ffn.in",
        "ffn.sum", "resid_post" (the output). Returns x and what self-attention returned."""
        x = tap("resid_pre", x)
        x, self_out = self.attn_block(x, self_attention, tap, "attn")
        x = tap("resid_mid", x)
        x, _ = self.ffn_block(x, feed_forward or (lambda h: (self.ffn(h), None)), tap, "ffn")
        return tap("resid_post", x), self_out


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output, FFN; each with Add &
    Norm. A decoder-only model (``cfg.decoder_only``) has no cross-attention: its layer is
    masked self-attention and FFN, the block of GPT and Llama."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = make_attention(cfg)
        self.cross_attn = None if cfg.decoder_only else make_attention(cfg)
        self.ffn = FeedForward(cfg)
        self.self_block = SublayerConnection(cfg)
        self.cross_block = None if cfg.decoder_only else SublayerConnection(cfg)
        self.ffn_block = SublayerConnection(cfg)

    def forward(
        self,
        x: Tensor,
        self_kv,
        cross_kv: tuple[Tensor, Tensor] | None,
        self_mask: Tensor | masks.Causal | None,
        memory_mask: Tensor | None,
        need_weights: bool = False,
        group: int = 1,
        rotary: tuple[Tensor, Tensor] | None = None,
        kernel=attention,
    ):
        """One decoder layer on the new target positions.

        Args:
            x: (B, T_new, C) the positions being decoded now.
            self_kv: this layer's self-attention cache: ``self_kv.extend(k, v)`` takes the new
                positions' K, V (B, H_kv, T_new, D) and gives those of every position to
                attend over (:meth:`~transformer.model.cache.KVCache.layer`).
            cross_kv: K, V (B / group, H, S, D) projected from the encoder output (computed
                once); None in a decoder-only model.
            self_mask: (B or 1, 1, T_new, T_past + T_new) causal mask (padding keys hidden
                too in a left-padded batch), ``masks.CAUSAL`` when nothing is cached or padded
                (the fused kernel's ``is_causal``), or None when T_new == 1 and nothing is padding.
            memory_mask: (B / group, 1, 1, S) source padding mask.
            group: consecutive rows of x that belong to one source sentence (beams).
            rotary: cos, sin of the new positions (rotary position embeddings), or None.
            kernel: the attention function both attentions call:
                :func:`~transformer.model.attention.attention`, or another form of it with
                its arguments and results.

        Returns:
            x (B, T_new, C), the self-attention K, V now covering T_past + T_new
            positions, and (self weights, cross weights), each None unless asked for.
        """

        def masked_self_attention(h: Tensor):
            q, k, v = self.self_attn.project_qkv(h)  # (B, H, T_new, D); K, V (B, H_kv, T_new, D)
            if rotary is not None:  # keys are cached rotated: each turned once, at its own position
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            k, v = self_kv.extend(k, v)  # (B, H_kv, T_past + T_new, D)
            out, w = self.self_attn.attend(q, k, v, self_mask, need_weights, kernel)
            return out, (k, v, w)

        def cross_attention(h: Tensor):
            if group == 1:
                return self.cross_attn(h, cross_kv[0], cross_kv[1], memory_mask, need_weights, kernel)
            # The `group` rows of a sentence share its K/V: attend as one row with
            # group * T_new queries (queries are independent), then split the rows again.
            n, t, c = h.shape
            out, w = self.cross_attn(h.reshape(n // group, group * t, c), cross_kv[0], cross_kv[1],
                                     memory_mask, need_weights, kernel)
            if w is not None:  # (B_src, H, group*T, S) -> (B_src*group, H, T, S)
                b, heads, _, s_len = w.shape
                w = w.view(b, heads, group, t, s_len).transpose(1, 2).reshape(n, heads, t, s_len)
            return out.reshape(n, t, c), w

        x, (k, v, self_w), cross_w = self.sublayers(x, masked_self_attention, cross_attention)
        return x, (k, v), (self_w, cross_w)

    def sublayers(self, x: Tensor, self_attention: Sublayer, cross_attention: Sublayer | None = None,
                  feed_forward: Sublayer | None = None, tap: Tap = untapped):
        """The layer's wiring: masked self-attention, then cross-attention (an encoder-decoder's
        layer), then the FFN (default: this layer's), each a function of the sub-layer's input
        h (B, T_new, C) -> (output (B, T_new, C), anything) inside its Add & Norm. ``tap`` as in
        :meth:`EncoderLayer.sublayers`, with "cross.in", "cross.sum" and "resid_cross" after
        the cross-attention. Returns x and what the two attentions returned (None: no
        cross-attention)."""
        x = tap("resid_pre", x)
        x, self_out = self.self_block(x, self_attention, tap, "attn")
        x = tap("resid_mid", x)
        cross_out = None
        if self.cross_attn is not None:
            x, cross_out = self.cross_block(x, cross_attention, tap, "cross")
            x = tap("resid_cross", x)
        x, _ = self.ffn_block(x, feed_forward or (lambda h: (self.ffn(h), None)), tap, "ffn")
        return tap("resid_post", x), self_out, cross_out

