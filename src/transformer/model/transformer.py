"""The encoder-decoder Transformer of "Attention Is All You Need".

    memory = model.encode(src)                       # (B, S) ids -> (B, S, C)
    cache = model.start_cache(memory, src)           # cross-attention K/V, computed once
    logits, cache = model.decode(tgt, cache)         # (B, T) ids -> (B, T, V); cache grows by T
    logits = model(src, tgt_in)                      # both at once, for training
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import ModelConfig
from . import masks
from .attention import attention
from .cache import KVCache
from .dropout import Dropout
from .embedding import PositionalEncoding, TokenEmbedding
from .layers import DecoderLayer, EncoderLayer, make_norm


class OutputHead:
    """What both models end with: the output projection, logits = h W + b, where W is the
    embedding table :meth:`head_embedding` (tied) when ``out_proj`` is None."""

    out_proj: nn.Module | None
    out_bias: Tensor | None

    def head_embedding(self) -> TokenEmbedding:
        """The embedding the projection is tied to when ``out_proj`` is None."""
        raise NotImplementedError

    def project(self, h: Tensor) -> Tensor:
        """Final linear layer: (..., C) -> (..., V) logits."""
        if self.out_proj is None:
            return nn.functional.linear(h, self.head_embedding().weight, self.out_bias)
        logits = self.out_proj(h)
        return logits if self.out_bias is None else logits + self.out_bias

    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """The projection as one (V, C) weight (the embedding's, when tied) and its (V,) bias or None."""
        return (self.head_embedding().weight if self.out_proj is None else self.out_proj.weight), self.out_bias

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Encoder(nn.Module):
    """N encoder layers (and a final LayerNorm when ``cfg.use_final_norm``), on embedded input."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.use_final_norm else None

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False):
        """x (B, S, C), mask (B, 1, 1, S) -> (B, S, C), list of per-layer weights (or Nones)."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, weights


class Decoder(nn.Module):
    """N decoder layers (and a final LayerNorm when ``cfg.use_final_norm``), on embedded input."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.use_final_norm else None

    def forward(self, x: Tensor, cache: KVCache, need_weights: bool = False, rotary=None, key_mask=None,
                kernel=attention):
        """x (B, T_new, C) -> (B, T_new, C), the grown cache, and per-layer (self, cross) weights.

        ``cache``: a :class:`~transformer.model.cache.KVCache`, or any cache with its
        interface (see :mod:`transformer.model.cache`). ``key_mask`` (B, T_past + T_new),
        True = a real token, masks the padding of a decoder-only model's left-padded batch;
        ``rotary`` is the new positions' cos, sin; ``kernel`` the attention function
        (:meth:`DecoderLayer.forward`)."""
        self_mask = cache.self_mask(x.size(1), key_mask, x.device)
        new_self_kv, weights = [], []
        for i, (layer, cross) in enumerate(zip(self.layers, cache.cross_kv)):
            x, kv, w = layer(x, cache.layer(i), cross, self_mask, cache.attend_mask, need_weights, cache.group, rotary,
                             kernel)
            new_self_kv.append(kv)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, cache.grown(new_self_kv), weights

    def cross_kv(self, memory: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
        """Each layer's cross-attention K, V (B, H, S, D), projected from the encoder output
        ``memory`` (B, S, C) once, all in one matmul (they read the same memory)."""
        attns = [layer.cross_attn for layer in self.layers]
        kv = attns[0].project_together(memory, [lin for a in attns for lin in (a.k_proj, a.v_proj)])
        return tuple(zip(kv[0::2], kv[1::2]))


class Transformer(OutputHead, nn.Module):
    """Encoder-decoder Transformer. See :class:`~transformer.ModelConfig` for the options.

    Shape:
        src: (B, S) and tgt: (B, T) token ids, right-padded with ``cfg.pad_id``.
        output: (B, T, V) logits (apply log_softmax / softmax for probabilities).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.pad_id)
        if cfg.tie_embeddings:
            self.tgt_embed = self.src_embed  # one module, one tensor: the optimizer sees it once
        else:
            self.tgt_embed = TokenEmbedding(cfg.target_vocab_size, cfg.d_model, cfg.pad_id)
        self.positions = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.sinusoid_layout)
        self.dropout = Dropout(cfg.dropout)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        if cfg.tie_embeddings:
            self.out_proj = None  # logits = h @ E^T with the shared embedding matrix
        else:
            self.out_proj = nn.Linear(cfg.d_model, cfg.target_vocab_size, bias=False)
        self.out_bias = nn.Parameter(torch.zeros(cfg.target_vocab_size)) if cfg.output_bias else None
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias") and "norm" not in name:
                nn.init.zeros_(p)

    # ---- the two halves -------------------------------------------------------------
    def src_mask(self, src: Tensor) -> Tensor:
        """(B, S) -> (B, 1, 1, S) padding mask, True = real token."""
        return masks.padding_mask(src, self.cfg.pad_id)

    def encode(self, src: Tensor, return_weights: bool = False, padded: bool | None = None):
        """(B, S) ids -> memory (B, S, C); with ``return_weights`` also the list of
        encoder self-attention weights, one (B, H, S, S) tensor per layer. ``padded``: whether
        any source holds padding, when the caller knows (None: read from ``src``)."""
        x = self.dropout(self.positions(self.src_embed(src)))
        mask = self.src_mask(src)
        padded = _has_padding(mask) if padded is None else padded
        memory, weights = self.encoder(x, mask if padded else None, return_weights)
        return (memory, weights) if return_weights else memory

    def start_cache(self, memory: Tensor, src: Tensor, padded: bool | None = None) -> KVCache:
        """A cache holding each decoder layer's cross-attention K, V (:meth:`Decoder.cross_kv`)
        and the source mask (``padded`` as in :meth:`encode`)."""
        cross = self.decoder.cross_kv(memory)
        mask = self.src_mask(src)
        padded = _has_padding(mask) if padded is None else padded
        return KVCache(cross_kv=cross, self_kv=(None,) * len(cross), memory_mask=mask, padded=padded)

    def decode(self, tgt: Tensor, cache: KVCache, return_weights: bool = False):
        """Decode the next ``T`` target positions.

        Args:
            tgt: (B, T) ids at positions ``cache.length`` .. ``cache.length + T - 1``.
            cache: from :meth:`start_cache` or an earlier ``decode``.

        Returns:
            logits (B, T, V) and the grown cache; with ``return_weights`` also a list of
            (self (B, H, T, T_total), cross (B, H, T, S)) weights, one pair per layer.
        """
        x = self.dropout(self.positions(self.tgt_embed(tgt), start=cache.length))
        h, cache, weights = self.decoder(x, cache, return_weights)
        logits = self.project(h)
        return (logits, cache, weights) if return_weights else (logits, cache)

    def head_embedding(self) -> TokenEmbedding:
        return self.tgt_embed

    def forward(self, src: Tensor, tgt: Tensor, select: Tensor | None = None, src_padded: bool | None = None) -> Tensor:
        """Teacher forcing: (B, S) source ids, (B, T) target-input ids -> (B, T, V) logits.

        ``select`` computes logits only at the positions it names (:func:`at_positions`) and
        returns them as (N, V) in row-major order: training skips the vocabulary projection at
        padding positions. ``src_padded``: whether any source holds padding, when the caller
        knows (a batch counts its lengths on the host); None: read from ``src``, once.

        The target's right padding needs no mask: the causal mask already keeps every real
        position from seeing the padding after it, and padding positions have no label.
        """
        padded = _has_padding(self.src_mask(src)) if src_padded is None else src_padded
        memory = self.encode(src, padded=padded)
        x = self.dropout(self.positions(self.tgt_embed(tgt)))
        h, _, _ = self.decoder(x, self.start_cache(memory, src, padded))
        return self.project(at_positions(h, select))


def at_positions(h: Tensor, select: Tensor | None) -> Tensor:
    """``h`` (B, T, ...) at the positions ``select`` names, as (N, ...) in row-major order (the
    hidden states, or training's labels): ``select``
    is a (B, T) bool mask, True where wanted, or the (N,) indices of its True entries in
    ``h.flatten(0, 1)`` (found before the batch reached a GPU, which then need not stop to
    count them). None: ``h`` as it is."""
    if select is None:
        return h
    if select.dtype == torch.bool:
        return h[select]
    return h.flatten(0, 1).index_select(0, select)


def _has_padding(mask: Tensor) -> bool:
    """Whether a padding mask masks anything (read on the host). Without padding, attention
    runs without a mask: the same numbers, fewer operations (sorted or bucketed batches are
    often unpadded)."""
    return not bool(mask.all())
