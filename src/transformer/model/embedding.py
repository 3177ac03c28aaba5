"""Token embeddings (scaled by sqrt(d_model)) and positional encodings; pretrained word
vectors for the embedding rows are read in data/word_vectors.py."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoid_table(max_len: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The paper's PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...).

    ``layout="interleaved"`` puts sin and cos on even and odd dimensions, as the paper's
    formula does; ``"concat"`` puts all sines first then all cosines (tensor2tensor,
    fairseq and Marian do this). Returns (max_len, d_model).
    """
    half = (d_model + 1) // 2
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (half,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, half)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    if layout == "interleaved":
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    else:
        pe[:, :half] = torch.sin(angle)
        pe[:, half:] = torch.cos(angle[:, : d_model - half])
    return pe.float()


class PositionalEncoding(nn.Module):
    """Adds PE[start : start + T] to (B, T, C) inputs; ``start`` is the KV-cache length."""

    def __init__(self, d_model: int, max_len: int, layout: str = "interleaved") -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", sinusoid_table(max_len, d_model, layout), persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        end = start + x.size(1)
        check_length(end, self.max_len)
        return x + self.pe[start:end].to(x.dtype)

    def at(self, x: Tensor, positions: Tensor) -> Tensor:
        """Adds PE[positions] to (B, T, C) inputs; ``positions`` (B, T), one row per sequence,
        each below ``max_len`` (the caller checks: :meth:`LanguageModel.hidden`)."""
        return x + self.pe[positions].to(x.dtype)


class LearnedPositions(nn.Module):
    """A trained vector per position (GPT-2's ``wpe``), added to the token embeddings."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def at(self, x: Tensor, positions: Tensor) -> Tensor:
        """Adds the vectors of ``positions`` (B, T), each below ``max_len``, to (B, T, C) inputs."""
        return x + nn.functional.embedding(positions, self.weight).to(x.dtype)


def check_length(n: int, max_len: int) -> None:
    """ValueError, saying what to do, when ``n`` positions do not fit a table of ``max_len``."""
    if n > max_len:
        raise ValueError(f"sequence of {n} positions is longer than the model's max_len={max_len}; "
                         "shorten the input or build the model with a larger max_len")


class TokenEmbedding(nn.Module):
    """Embedding lookup multiplied by sqrt(d_model) (section 3.4 of the paper; ``scale=False``:
    the plain lookup, as GPT and Llama do)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int, scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.pad_id = pad_id
        nn.init.normal_(self.weight, mean=0.0, std=d_model ** -0.5)

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) ids -> (B, T, C)."""
        return nn.functional.embedding(tokens, self.weight) * self.scale
