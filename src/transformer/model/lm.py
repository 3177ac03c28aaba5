"""The decoder-only Transformer: a language model (GPT, Llama) built from the same parts as
the encoder-decoder (the decoder layers without cross-attention, the one attention function,
the one mask convention, the one KV cache).

    logits = model(tokens)                             # (B, T) ids -> (B, T, V), causal
    cache = model.start_cache(batch_size)
    logits, cache = model.decode(tokens, cache)        # the next T positions; cache grows by T

As the article's opening note puts it, the model is a stack of trained matrices: two global ones,
the embedding ``We`` (``embed.weight``) and the output head ``Whead`` (``out_proj.weight``, or
``We`` itself when tied), and in each layer ``WQ, WK, WV, WO`` (``self_attn.q_proj`` ...
``out_proj``) and the FFN's ``W_up, W_down`` (``ffn.fc1, ffn.fc2``) and, gated (SwiGLU),
``W_gate`` (``ffn.gate``). :func:`transformer.viz.matrices.weight_matrices` lists them
under those names.

A batch of sequences of different lengths is left-padded: ``real`` (B, T) marks the real
tokens (by default, every token that is not ``pad_id``); padding is masked as keys, and each
row's positions count its real tokens only, so a row decodes as it would alone. Pass
``real`` explicitly for a model whose ``pad_id`` is also a real token (an imported GPT-2).
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from .config import ModelConfig
from . import masks
from .cache import KVCache
from .dropout import Dropout
from .embedding import LearnedPositions, PositionalEncoding, TokenEmbedding, check_length
from .rotary import Rotary
from .transformer import Decoder, OutputHead, at_positions


class LanguageModel(OutputHead, nn.Module):
    """Decoder-only Transformer; see :class:`~transformer.ModelConfig` (``kind="decoder-only"``).

    Shape:
        tokens: (B, T) ids (left-padded with ``cfg.pad_id`` when rows differ in length).
        output: (B, T, V) logits for the token after each position.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not cfg.decoder_only:
            raise ValueError("LanguageModel needs kind='decoder-only'; the encoder-decoder is Transformer")
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg.vocab_size, cfg.d_model, cfg.pad_id, scale=cfg.embed_scale)
        self.positions = None
        if cfg.positions == "learned":
            self.positions = LearnedPositions(cfg.d_model, cfg.max_len)
        elif cfg.positions == "sinusoidal":
            self.positions = PositionalEncoding(cfg.d_model, cfg.max_len, cfg.sinusoid_layout)
        self.rotary = None
        if cfg.positions == "rope":
            self.rotary = Rotary(cfg.d_head, cfg.max_len, cfg.rope_theta, cfg.rope_scaling)
        self.dropout = Dropout(cfg.dropout)
        self.decoder = Decoder(cfg)
        self.out_proj = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.out_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.output_bias else None
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's initialisation (Llama's too): every matrix from N(0, 0.02), the two that
        write into the residual stream (W_O and W_down) scaled by 1/sqrt(2N), biases 0."""
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual = name.endswith(("self_attn.out_proj.weight", "ffn.fc2.weight"))
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers) if residual else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    # ---- the cache --------------------------------------------------------------------
    def start_cache(self, batch_size: int, device: torch.device | str | None = None) -> KVCache:
        """An empty cache for ``batch_size`` sequences."""
        device = device or self.embed.weight.device
        n = self.cfg.n_layers
        return KVCache(cross_kv=(None,) * n, self_kv=(None,) * n, memory_mask=None, padded=False,
                       next_position=torch.zeros(batch_size, dtype=torch.long, device=device))

    def decode(self, tokens: Tensor, cache: KVCache, return_weights: bool = False, real: Tensor | None = None):
        """The next ``T`` positions of each sequence.

        Args:
            tokens: (B, T) ids; the first call may hold left-padded prompts.
            cache: from :meth:`start_cache` or an earlier ``decode``.
            real: (B, T) bool, True at real tokens (default: ``tokens != pad_id``).

        Returns:
            logits (B, T, V) and the grown cache; with ``return_weights`` also a list of
            (B, H, T, T_total) self-attention weights, one per layer.
        """
        h, cache, weights = self.hidden(tokens, cache, return_weights, real)
        logits = self.project(h)
        return (logits, cache, weights) if return_weights else (logits, cache)

    def hidden(self, tokens: Tensor, cache: KVCache, need_weights: bool = False, real: Tensor | None = None,
               padded: bool = True):
        """The final hidden states (B, T, C), the grown cache and the attention weights.
        ``padded=False``: the caller vouches that every token is real (a training window), so
        no key mask is built and positions count on from the cache's (read on the host
        neither to skip the mask nor to check the positions: the cache's length tells).
        ValueError when a position would not fit ``max_len``."""
        key_mask = cache.key_mask
        if padded or key_mask is not None:
            real = tokens != self.cfg.pad_id if real is None else real
            if key_mask is not None or not bool(real.all()):  # no padding anywhere: no key mask
                key_mask = masks.extend_real_keys(key_mask, real, cache.length)
            advance = real.sum(1)
            positions = next_positions(cache.next_position, real)
            check_length(int(positions.max()) + 1 if positions.numel() else 0, self.cfg.max_len)
        else:
            advance = tokens.size(1)
            positions = cache.next_position[:, None] + torch.arange(advance, device=tokens.device)
            check_length(cache.length + advance, self.cfg.max_len)  # (every row's next position is the length)
        x, rotary = self.decoder_input(tokens, positions)
        h, cache, weights = self.decoder(x, cache, need_weights, rotary, key_mask)
        cache = replace(cache, key_mask=key_mask, next_position=cache.next_position + advance)
        return h, cache, [w for w, _ in weights]

    def decoder_input(self, tokens: Tensor, positions: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """(B, T) ids at (B, T) positions -> the decoder's input (B, T, C) and the rotary cos,
        sin (None without rotary embeddings), the positions below ``max_len``."""
        x = self.embed(tokens)
        if self.positions is not None:
            x = self.positions.at(x, positions)
        rotary = self.rotary(positions) if self.rotary is not None else None
        return self.dropout(x), rotary

    # ---- the output (Whead: OutputHead.project) ---------------------------------------
    def head_embedding(self) -> TokenEmbedding:
        return self.embed  # We, when Whead is tied to it

    def forward(self, tokens: Tensor, select: Tensor | None = None, real: Tensor | None = None,
                padded: bool = True) -> Tensor:
        """(B, T) ids -> (B, T, V) logits for the next token at every position; ``select``: only
        at the positions it names, as (N, V) in row-major order (training skips the vocabulary
        projection where there is no label; see :func:`at_positions`); ``real`` as in :meth:`decode`;
        ``padded=False`` as in :meth:`hidden` (training windows: no padding by construction)."""
        h, _, _ = self.hidden(tokens, self.start_cache(tokens.size(0), tokens.device), real=real, padded=padded)
        return self.project(at_positions(h, select))


def next_positions(next_position: Tensor, real: Tensor) -> Tensor:
    """The positions (B, T) of new tokens after each row's ``next_position`` (B,); ``real``
    (B, T) is True at real tokens: a row counts its real ones only (padding gets 0, unused)."""
    return (next_position[:, None] + real.long().cumsum(1) - 1).clamp(min=0)
