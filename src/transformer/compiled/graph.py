"""One decoding step as the graph that is exported and built: the model's own embeddings, decoder
(its layers' wiring included) and projection on fixed-shape buffers, which stand in for the
model's cache, with attention as a graph takes it (:mod:`transformer.kernels`). The new tokens (B, T_new)
take slots ``index`` (T_new,) of each layer's ``k``, ``v`` (B, H_kv, L, D), written in place;
attention reads the first U slots (``slots``, (U,): a size kept symbolic, like the rows, the
source length and the capacity). Returns the last position's logits (B, V) or log-probabilities.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from ..decode.scoring import next_token_logprobs
from ..kernels.attention import graph_attention
from ..model import masks
from ..model.lm import next_positions


def _kernel(q: Tensor, k: Tensor, v: Tensor, mask, dropout_p: float = 0.0,  # noqa: ARG001
            need_weights: bool = False) -> tuple[Tensor, None]:  # noqa: ARG001
    """The model's attention function as the step computes it (:func:`graph_attention`; a
    decoding step asks for no weights and drops nothing)."""
    return graph_attention(q, k, v, mask), None


@dataclass(frozen=True)
class _Slots:
    """One layer's self-attention cache as the model's layer asks for it (``extend``), on the
    fixed buffers ``k``, ``v`` (B, H_kv, L, D): the new positions' K, V are written in place at
    slots ``index``; attention reads the first ``upto`` slots."""

    k: Tensor
    v: Tensor
    index: Tensor
    upto: int

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k.index_copy_(2, self.index, k)
        self.v.index_copy_(2, self.index, v)
        return self.k[:, :, :self.upto], self.v[:, :, :self.upto]  # (B, H_kv, U, D)


@dataclass(frozen=True)
class _SlotCache:
    """The cache the model's decoder reads (:mod:`transformer.model.cache`'s interface) on the
    step's buffers: ``self_mask`` given whole; an encoder-decoder's cross-attention (K, V) per
    layer, source mask (applied even unpadded) and rows per sentence."""

    k: tuple[Tensor, ...]
    v: tuple[Tensor, ...]
    index: Tensor
    upto: int
    mask: Tensor
    cross_kv: tuple
    attend_mask: Tensor | None = None
    group: int = 1

    def layer(self, i: int) -> _Slots:
        return _Slots(self.k[i], self.v[i], self.index, self.upto)

    def self_mask(self, t_new: int, key_mask=None, device=None) -> Tensor:  # noqa: ARG002
        return self.mask

    def grown(self, self_kv) -> "_SlotCache":  # noqa: ARG002 (written in place)
        return self


def decoder(model: nn.Module, x: Tensor, cache: _SlotCache, rotary=None) -> Tensor:
    """``model.decoder`` (its layers' wiring, its final norm) on the new positions' input ``x``
    (B, T_new, C), on the step's buffers, attention as the graph computes it."""
    return model.decoder(x, cache, rotary=rotary, kernel=_kernel)[0]


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
        cache = _SlotCache(k, v, index, upto, masks.causal_slots(index, upto), tuple(zip(cross_k, cross_v)),
                           memory_mask, self.group)
        return self._out(decoder(model, x, cache))


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
        self_mask = masks.combine(masks.real_keys(key_mask[:, :upto]), masks.causal_slots(index, upto))
        cache = _SlotCache(k, v, index, upto, self_mask, (None,) * len(k))
        return self._out(decoder(model, x, cache, rotary))
