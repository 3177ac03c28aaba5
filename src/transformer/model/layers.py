"""Encoder and decoder layers: attention and feed-forward sub-layers with Add & Norm.

Post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
Pre-norm  (option):     x = x + Dropout(Sublayer(LayerNorm(x)))
Masks: boolean, True = may attend (see :mod:`transformer.model.masks`).
"""
from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from . import masks
from .attention import MultiHeadAttention
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


class SublayerConnection(nn.Module):
    """Residual connection and LayerNorm around one sub-layer (post- or pre-norm)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], tuple[Tensor, object]]):
        """Returns (new x, whatever else the sub-layer returned)."""
        if self.norm_first:
            y, extra = sublayer(self.norm(x))
            return x + self.dropout(y), extra
        y, extra = sublayer(x)
        return self.norm(x + self.dropout(y)), extra


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

        x, weights = self.attn_block(x, self_attention)
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, weights


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

        Returns:
            x (B, T_new, C), the self-attention K, V now covering T_past + T_new
            positions, and (self weights, cross weights), each None unless asked for.
        """

        def masked_self_attention(h: Tensor):
            q, k, v = self.self_attn.project_qkv(h)  # (B, H, T_new, D); K, V (B, H_kv, T_new, D)
            if rotary is not None:  # keys are cached rotated: each turned once, at its own position
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            k, v = self_kv.extend(k, v)  # (B, H_kv, T_past + T_new, D)
            out, w = self.self_attn.attend(q, k, v, self_mask, need_weights)
            return out, (k, v, w)

        def cross_attention(h: Tensor):
            if group == 1:
                return self.cross_attn(h, cross_kv[0], cross_kv[1], memory_mask, need_weights)
            # The `group` rows of a sentence share its K/V: attend as one row with
            # group * T_new queries (queries are independent), then split the rows again.
            n, t, c = h.shape
            out, w = self.cross_attn(h.reshape(n // group, group * t, c), cross_kv[0], cross_kv[1],
                                     memory_mask, need_weights)
            if w is not None:  # (B_src, H, group*T, S) -> (B_src*group, H, T, S)
                b, heads, _, s_len = w.shape
                w = w.view(b, heads, group, t, s_len).transpose(1, 2).reshape(n, heads, t, s_len)
            return out.reshape(n, t, c), w

        x, (k, v, self_w) = self.self_block(x, masked_self_attention)
        cross_w = None
        if self.cross_attn is not None:
            x, cross_w = self.cross_block(x, cross_attention)
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, (k, v), (self_w, cross_w)

