"""One decoding step as the graph that is exported and built: the model's own embeddings, layers
and projection on fixed-shape buffers, attention as a graph takes it. The new tokens (B, T_new)
take slots ``index`` (T_new,) of each layer's ``k``, ``v`` (B, H_kv, L, D), written in place;
attention reads the first U slots (``slots``, (U,): a size kept symbolic, like the rows, the
source length and the capacity). Returns the last position's logits (B, V) or log-probabilities.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..decode.scoring import next_token_logprobs
from ..model import masks
from ..model.attention import attention_weights
from ..model.lm import next_positions
from ..model.rotary import apply_rotary


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


def _self_attention(attn, h: Tensor, k_buf: Tensor, v_buf: Tensor, index: Tensor, upto: int, mask: Tensor, rotary):
    q, k, v = attn.project_qkv(h)  # (B, H, T_new, D); K, V (B, H_kv, T_new, D)
    if rotary is not None:  # keys are kept rotated, as in the model's cache
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    k_buf.index_copy_(2, index, k)
    v_buf.index_copy_(2, index, v)
    k, v = attn.expand_kv(k_buf[:, :, :upto], v_buf[:, :, :upto])  # (B, H, U, D)
    return attn.out_proj(attn.merge_heads(graph_attention(q, k, v, mask))), None


def _cross_attention(attn, h: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor, group: int):
    n, t, c = h.shape  # the `group` rows of a sentence attend as one row of group * T_new queries
    q = attn.split_heads(attn.q_proj(h if group == 1 else h.reshape(n // group, group * t, c)))
    out = attn.out_proj(attn.merge_heads(graph_attention(q, *attn.expand_kv(*kv), mask)))
    return (out if group == 1 else out.reshape(n, t, c)), None


def decoder_layers(model: nn.Module, x: Tensor, k: tuple, v: tuple, index: Tensor, upto: int, self_mask: Tensor,
                   rotary=None, cross_kv=None, memory_mask=None, group: int = 1) -> Tensor:
    """``model.decoder`` on the new positions' input ``x`` (B, T_new, C), each layer's
    parameters and sub-layer connections the model's own; an encoder-decoder's cross-attention
    (K, V) per layer, source mask and rows per sentence (``group``) as in its cache."""
    for i, layer in enumerate(model.decoder.layers):
        x, _ = layer.self_block(x, lambda h: _self_attention(layer.self_attn, h, k[i], v[i], index, upto, self_mask,
                                                             rotary))
        if layer.cross_attn is not None:
            x, _ = layer.cross_block(x, lambda h: _cross_attention(layer.cross_attn, h, cross_kv[i], memory_mask,
                                                                   group))
        x, _ = layer.ffn_block(x, lambda h: (layer.ffn(h), None))
    return x if model.decoder.norm is None else model.decoder.norm(x)


def causal_slots(index: Tensor, upto: int) -> Tensor:
    """(1, 1, T_new, U): the query at slot ``index[i]`` may attend to slots 0 .. ``index[i]``."""
    return (torch.arange(upto, device=index.device)[None, :] <= index[:, None])[None, None]


class _Step(nn.Module):
    def __init__(self, model: nn.Module, group: int = 1, logprobs: bool = False) -> None:
        super().__init__()
        self.model, self.group, self.logprobs = model, group, logprobs

    def _out(self, h: Tensor) -> Tensor:  # the last position's logits, or log-probabilities
        logits = self.model.project(h[:, -1])
        return next_token_logprobs(logits, self.model.cfg) if self.logprobs else logits


class TranslationStep(_Step):
    """A :class:`~transformer.model.Transformer`'s step; ``group`` decoder rows per source
    sentence (1: greedy search, else the beam size: the one size that is not symbolic)."""

    def forward(self, tgt, index, slots, k, v, cross_k, cross_v, memory_mask):
        model, upto = self.model, slots.size(0)
        x = model.dropout(model.positions.at(model.tgt_embed(tgt), index[None, :].expand(tgt.size(0), -1)))
        return self._out(decoder_layers(model, x, k, v, index, upto, causal_slots(index, upto), None,
                                        tuple(zip(cross_k, cross_v)), memory_mask, self.group))


class GenerationStep(_Step):
    """A :class:`~transformer.model.LanguageModel`'s step: ``real`` (B, T_new) marks the real
    tokens (left-padded prompts), recorded in ``key_mask`` (B, L); ``next_position`` (B,)
    counts each row's real tokens (both written in place)."""

    def forward(self, tokens, real, index, slots, k, v, key_mask, next_position):
        model, upto = self.model, slots.size(0)
        key_mask.index_copy_(1, index, real)
        positions = next_positions(next_position, real)
        next_position.add_(real.sum(1))
        x, rotary = model.decoder_input(tokens, positions)
        self_mask = masks.combine(masks.real_keys(key_mask[:, :upto]), causal_slots(index, upto))
        return self._out(decoder_layers(model, x, k, v, index, upto, self_mask, rotary))
