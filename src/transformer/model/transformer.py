"""The encoder-decoder Transformer of "Attention Is All You Need".

    memory = model.encode(src)                       # (B, S) ids -> (B, S, C)
    cache = model.start_cache(memory, src)           # cross-attention K/V, computed once
    logits, cache = model.decode(tgt, cache)         # (B, T) ids -> (B, T, V); cache grows by T
    logits = model(src, tgt_in)                      # both at once, for training
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from . import masks
from .attention import fused_projection
from .cache import KVCache
from .dropout import Dropout
from .embedding import PositionalEncoding, TokenEmbedding
from .layers import DecoderLayer, EncoderLayer


class Encoder(nn.Module):
    """N encoder layers (and a final LayerNorm when ``cfg.use_final_norm``), on embedded input."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.use_final_norm else None

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
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.use_final_norm else None

    def forward(self, x: Tensor, cache: KVCache, need_weights: bool = False):
        """x (B, T_new, C) -> (B, T_new, C), the grown cache, and per-layer (self, cross) weights."""
        t_past, t_new = cache.length, x.size(1)
        self_mask = None if t_new == 1 else masks.causal_mask(t_new, t_past + t_new, x.device)
        new_self_kv, weights = [], []
        for layer, past, cross in zip(self.layers, cache.self_kv, cache.cross_kv):
            x, kv, w = layer(x, past, cross, self_mask, cache.attend_mask, need_weights, cache.group)
            new_self_kv.append(kv)
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return x, replace(cache, self_kv=tuple(new_self_kv)), weights


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
        k = cfg.target_vocab_size if cfg.output_vocab_size is None else cfg.output_vocab_size
        if cfg.tie_embeddings:
            self.out_proj = None  # logits = h @ E^T with the shared embedding matrix (its output_ids rows)
        else:
            self.out_proj = nn.Linear(cfg.d_model, k, bias=False)  # one row per output id
        self.out_bias = nn.Parameter(torch.zeros(k)) if cfg.output_bias else None
        if cfg.output_vocab_size is None:
            self.output_ids = self.output_index = None
        else:  # which target ids get logits (set_output_ids), and each id's row (-1: none)
            self.register_buffer("output_ids", torch.arange(k))
            index = torch.full((cfg.target_vocab_size,), -1, dtype=torch.long)
            self.register_buffer("output_index", index.index_copy_(0, torch.arange(k), torch.arange(k)))
        self._init_weights()

    def set_output_ids(self, ids) -> None:
        """The target ids that get logits (``cfg.output_vocab_size`` distinct ids, ``eos_id``
        among them); all others are never produced. Set before training."""
        ids = torch.as_tensor(sorted(set(int(i) for i in ids)), dtype=torch.long)
        k, v = self.cfg.output_vocab_size, self.cfg.target_vocab_size
        if self.output_ids is None or len(ids) != k:
            raise ValueError(f"set_output_ids: expected {k} distinct ids, got {len(ids)}")
        if ids[0] < 0 or ids[-1] >= v or self.cfg.eos_id not in ids.tolist():
            raise ValueError(f"set_output_ids: ids must lie in [0, {v}) and include eos_id {self.cfg.eos_id}")
        self.output_ids.copy_(ids)
        self.output_index.fill_(-1)[self.output_ids] = torch.arange(k, device=self.output_index.device)

    def with_output_ids(self, ids) -> "Transformer":
        """A copy of this (unrestricted) model whose output keeps only ``ids``: the same
        logits there, -inf elsewhere."""
        if self.output_ids is not None:
            raise ValueError("with_output_ids: the model's output is restricted already")
        ids = sorted(set(int(i) for i in ids))
        out = Transformer(self.cfg.replace(output_vocab_size=len(ids)))
        out.set_output_ids(ids)
        state = {**self.state_dict(), "output_ids": out.output_ids, "output_index": out.output_index}
        for name in ("out_bias", "out_proj.weight"):  # one row per output id
            if name in state:
                state[name] = state[name][out.output_ids]
        out.load_state_dict(state)
        return out.to(self.tgt_embed.weight.device).train(self.training)

    def output_positions(self, target: Tensor) -> Tensor:
        """Target ids -> their columns in :meth:`project_outputs`'s logits (-1 for an id the
        output vocabulary lacks); the ids themselves when the output is not restricted."""
        return target if self.output_index is None else self.output_index[target]

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
        kv = fused_projection(memory, [lin for a in attns for lin in (a.k_proj, a.v_proj)], self.cfg.n_heads)
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

    def project(self, h: Tensor) -> Tensor:
        """Final linear layer: (B, T, C) -> (B, T, V) logits; -inf for the ids outside
        ``output_ids`` when the output vocabulary is restricted."""
        logits = self.project_outputs(h)
        if self.output_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.cfg.target_vocab_size), float("-inf"))
        return full.index_copy_(-1, self.output_ids, logits)

    def project_outputs(self, h: Tensor) -> Tensor:
        """(..., C) -> (..., K) logits for the ids ``output_ids`` (K = V, all ids, when the
        output is not restricted). Training's loss works on these."""
        if self.out_proj is None:
            weight = self.tgt_embed.weight
            if self.output_ids is not None:
                weight = weight.index_select(0, self.output_ids)
            return nn.functional.linear(h, weight, self.out_bias)
        logits = self.out_proj(h)  # a module call: it may be a quantised layer (decode/precision.py)
        return logits if self.out_bias is None else logits + self.out_bias

    def dense_output_layer(self) -> tuple[Tensor, Tensor | None]:
        """The projection as one (V, C) weight and (V,) bias, for exporters: a restricted
        output gets bias -1e4 (probability ~0) at the ids it lacks and zero rows for them."""
        weight = self.tgt_embed.weight if self.out_proj is None else self.out_proj.weight
        if self.output_ids is None:
            return weight, self.out_bias
        v, ids = self.cfg.target_vocab_size, self.output_ids
        if self.out_proj is not None:
            weight = weight.new_zeros(v, weight.size(1)).index_copy_(0, ids, weight)
        bias = weight.new_full((v,), -1e4).index_fill_(0, ids, 0.0)
        if self.out_bias is not None:
            bias = bias.index_copy(0, ids, self.out_bias.to(bias.dtype))
        return weight, bias

    def forward(self, src: Tensor, tgt: Tensor, select: Tensor | None = None) -> Tensor:
        """Teacher forcing: (B, S) source ids, (B, T) target-input ids -> (B, T, V) logits.

        ``select`` (B, T) bool computes logits only where True and returns them as (N, K)
        in row-major order, over the ids ``output_ids`` (K = V when the output is not
        restricted; :meth:`output_positions` maps gold ids to columns): training skips the
        vocabulary projection at padding positions and at ids that are never produced.
        """
        memory = self.encode(src)
        x = self.dropout(self.positions(self.tgt_embed(tgt)))
        h, _, _ = self.decoder(x, self.start_cache(memory, src))
        if select is not None:
            return self.project_outputs(h[select])  # (N, K)
        return self.project(h)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _has_padding(mask: Tensor) -> bool:
    """Whether a padding mask masks anything. Without padding, attention runs without a mask:
    the same numbers, fewer operations (sorted or bucketed batches are often unpadded).
    Under ``torch.export`` (the ONNX exporter) the answer would depend on the data, so
    exported graphs always apply the mask."""
    if torch.compiler.is_exporting():
        return True
    return not bool(mask.all())
