"""The encoder-decoder Transformer of "Attention Is All You Need".

    memory = model.encode(src)                       # (B, S) ids -> (B, S, C)
    cache = model.start_cache(memory, src)           # cross-attention K/V, computed once
    logits, cache = model.decode(tgt, cache)         # (B, T) ids -> (B, T, V); cache grows by T
    static = model.start_static_cache(cache, 64)     # or a fixed-shape cache, written in place
    logits = model.decode_static(tgt, static)        # (B, T) ids -> (B, V), the last position's
    logits = model(src, tgt_in)                      # both at once, for training
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from . import masks
from .attention import fused_projection
from .cache import KVCache, Slots, StaticKVCache
from .dropout import Dropout
from .embedding import PositionalEncoding, TokenEmbedding
from .layers import DecoderLayer, EncoderLayer, make_norm


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

    def forward(self, x: Tensor, cache: KVCache, need_weights: bool = False, rotary=None, key_mask=None):
        """x (B, T_new, C) -> (B, T_new, C), the grown cache, and per-layer (self, cross) weights.

        ``key_mask`` (B, T_past + T_new), True = a real token, masks the padding of a
        decoder-only model's left-padded batch; ``rotary`` is the new positions' cos, sin."""
        t_past, t_new = cache.length, x.size(1)
        self_mask = None if t_new == 1 else masks.causal_mask(t_new, t_past + t_new, x.device)
        if key_mask is not None:
            self_mask = masks.combine(self_mask, key_mask[:, None, None, :])
        new_self_kv, weights = [], []
        for layer, past, cross in zip(self.layers, cache.self_kv, cache.cross_kv):
            x, kv, w = layer(x, past, cross, self_mask, cache.attend_mask, need_weights, cache.group, rotary)
            new_self_kv.append(kv)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, replace(cache, self_kv=tuple(new_self_kv)), weights

    def forward_slots(self, x: Tensor, slots: list[Slots], mask: Tensor, rotary=None, cross_kv=None,
                      memory_mask: Tensor | None = None, group: int = 1) -> Tensor:
        """x (B, T_new, C) -> (B, T_new, C) on a fixed-shape cache (one :class:`Slots` per
        layer, written in place); ``mask`` (B or 1, 1, T_new, L) True = may attend;
        ``cross_kv`` per layer, ``memory_mask`` and ``group`` for an encoder-decoder."""
        for i, (layer, layer_slots) in enumerate(zip(self.layers, slots)):
            cross = None if cross_kv is None else cross_kv[i]
            x, _, _ = layer(x, layer_slots, cross, mask, memory_mask, False, group, rotary)
        return x if self.norm is None else self.norm(x)


class Transformer(nn.Module):
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

    def encode(self, src: Tensor, return_weights: bool = False):
        """(B, S) ids -> memory (B, S, C); with ``return_weights`` also the list of
        encoder self-attention weights, one (B, H, S, S) tensor per layer."""
        x = self.dropout(self.positions(self.src_embed(src)))
        mask = self.src_mask(src)
        memory, weights = self.encoder(x, mask if _has_padding(mask) else None, return_weights)
        return (memory, weights) if return_weights else memory

    def start_cache(self, memory: Tensor, src: Tensor) -> KVCache:
        """Project the encoder output to each decoder layer's cross-attention K, V once
        (all layers' K and V in one matmul: they read the same memory)."""
        attns = [layer.cross_attn for layer in self.decoder.layers]
        kv = fused_projection(memory, [lin for a in attns for lin in (a.k_proj, a.v_proj)], self.cfg.d_head)
        cross = tuple(zip(kv[0::2], kv[1::2]))
        mask = self.src_mask(src)
        return KVCache(cross_kv=cross, self_kv=(None,) * len(cross), memory_mask=mask, padded=_has_padding(mask))

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

    # ---- the fixed-shape cache (compiled decoding, see decode/static.py) -------------------
    def start_static_cache(self, cache: KVCache, capacity: int) -> StaticKVCache:
        """A fixed-shape cache for ``capacity`` target positions, holding the cross-attention
        K, V and source mask of ``cache`` (from :meth:`start_cache`, and ``expand``-ed for
        beams: ``cache.group`` decoder rows per sentence)."""
        if not 1 <= capacity <= self.cfg.max_len:
            raise ValueError(f"capacity must be 1 to max_len={self.cfg.max_len}, got {capacity}")
        k0 = cache.cross_kv[0][0]
        attn = self.decoder.layers[0].self_attn
        static = StaticKVCache.empty(self.cfg.n_layers, k0.size(0) * cache.group, attn.n_kv_heads, capacity,
                                     attn.d_head, k0.dtype, k0.device)
        # contiguous: the compiled step is specialised to its inputs' layout, and a search that
        # drops rows (StaticKVCache.select) hands it contiguous copies
        static.cross_kv = tuple((k.contiguous(), v.contiguous()) for k, v in cache.cross_kv)
        static.memory_mask, static.group = cache.attend_mask, cache.group
        return static

    def decode_static(self, tgt: Tensor, cache: StaticKVCache, step=None) -> Tensor:
        """The next ``T`` target positions, written into ``cache`` in place: (B, V) logits
        of the last one, the same numbers as :meth:`decode`'s. ``step``: :meth:`step_slots`
        or a compiled version of it (default: the former), whose output this returns (the
        searches' compiled step returns log-probabilities: ``decode/static.py``)."""
        t = tgt.size(1)
        index = cache.next_slots(t)
        logits = (step or self.step_slots)(tgt, index, cache.k, cache.v, cache.cross_kv, cache.memory_mask,
                                           cache.length + t, cache.group)
        cache.length += t
        return logits

    def step_slots(self, tgt: Tensor, index: Tensor, k: tuple[Tensor, ...], v: tuple[Tensor, ...],
                   cross_kv, memory_mask: Tensor | None, upto: int, group: int = 1) -> Tensor:
        """The tensor-only core of :meth:`decode_static`, what ``torch.compile`` compiles:
        target tokens (B, T) at slots (= positions) ``index`` (T,), their self-attention K, V
        written into ``k``, ``v`` in place; attention reads the first ``upto`` slots (those
        written, the new ones included). Returns the last position's logits (B, V)."""
        x = self.positions.at(self.tgt_embed(tgt), index[None, :].expand(tgt.size(0), -1))
        slots = torch.arange(upto, device=tgt.device)
        mask = (slots[None, :] <= index[:, None])[None, None]  # (1, 1, T, upto): causal, unwritten slots hidden
        h = self.decoder.forward_slots(self.dropout(x), [Slots(kb, vb, index, upto) for kb, vb in zip(k, v)], mask,
                                       cross_kv=cross_kv, memory_mask=memory_mask, group=group)
        return self.project(h[:, -1])

    def project(self, h: Tensor) -> Tensor:
        """Final linear layer: (..., C) -> (..., V) logits."""
        if self.out_proj is None:
            return nn.functional.linear(h, self.tgt_embed.weight, self.out_bias)
        logits = self.out_proj(h)  # a module call: it may be an int8 layer (decode/precision.py)
        return logits if self.out_bias is None else logits + self.out_bias

    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """The projection as one (V, C) weight and its (V,) bias or None, for exporters."""
        weight = self.tgt_embed.weight if self.out_proj is None else self.out_proj.weight
        return weight, self.out_bias

    def forward(self, src: Tensor, tgt: Tensor, select: Tensor | None = None) -> Tensor:
        """Teacher forcing: (B, S) source ids, (B, T) target-input ids -> (B, T, V) logits.

        ``select`` (B, T) bool computes logits only where True and returns them as (N, V)
        in row-major order: training skips the vocabulary projection at padding positions.
        """
        memory = self.encode(src)
        x = self.dropout(self.positions(self.tgt_embed(tgt)))
        h, _, _ = self.decoder(x, self.start_cache(memory, src))
        if select is not None:
            return self.project(h[select])  # (N, V)
        return self.project(h)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _has_padding(mask: Tensor) -> bool:
    """Whether a padding mask masks anything. Without padding, attention runs without a mask:
    the same numbers, fewer operations (sorted or bucketed batches are often unpadded).
    Under ``torch.export`` (the ONNX exporter) the answer would depend on the data, so
    exported graphs always apply the mask, and compiled ones too (no branch on data)."""
    if torch.compiler.is_exporting() or torch.compiler.is_compiling():
        return True
    return not bool(mask.all())
