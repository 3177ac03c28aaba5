"""Plain text as one token stream, for a decoder-only language model: reading, the
train/validation split, random training windows and fixed validation windows.

    text = read_texts(paths)                       # the files' contents, in order
    train_text, valid_text = split_text(text, 0.1)  # nanoGPT's split: the last 10% for validation
    stream = torch.tensor(tokenizer.encode(train_text))
    sampler = WindowSampler(len(stream), context=64, batch_size=12, seed=1)
    batch = windows(stream, sampler.next_starts(), 64)  # x (B, T) and y = x shifted by one

A window of context ``T`` reads tokens ``s .. s+T-1`` and predicts ``s+1 .. s+T``, so it
needs ``T + 1`` tokens of the stream.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..run.layout import SUBWORDS, run_file
from .batching import Movable, label_positions
from .chars import CHARS_FILE, Chars
from .corpus import decode_lines, read_bytes
from .hf_tokenizer import (HF_TOKENIZER, SP_TOKENIZER, PretrainedTokenizer, SentencePieceTokenizer,
                           load_pretrained_tokenizer)
from .subwords import PAD_ID, Subwords

__all__ = ["read_text", "read_texts", "split_text", "LineSubwords", "load_tokenizer", "WindowSampler", "TextBatch",
           "windows", "validation_windows"]


def read_text(path: str | Path, use: str = "train on") -> str:
    """A UTF-8 file's text, as it is (newlines kept; a leading byte-order mark removed),
    gunzipped when the name ends in ``.gz``. ``use``: what the text is for, in the message
    for an empty file ("give a text to train on").

    Raises:
        UserError: the file is missing, a directory, not valid gzip, empty, or not UTF-8 (file
            and line named).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {'is a directory, expected a text file' if path.is_dir() else 'file not found'}")
    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        decode_lines(data, str(path))  # raises the one-line error that names the line
        raise
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise UserError(f"{path}: the file holds no text; give a text to {use}")
    return text


def read_texts(paths: Sequence[str | Path]) -> str:
    """Several files read as one text, in order (nothing inserted between them)."""
    return "".join(read_text(p) for p in paths)


def split_text(text: str, valid_fraction: float) -> tuple[str, str]:
    """The first ``1 - valid_fraction`` of the characters for training, the rest for
    validation: nanoGPT's contiguous split (``data[:int(n * 0.9)]``), made on the text so
    that both tokenizers split at the same place (for characters it is the token split)."""
    cut = int(len(text) * (1 - valid_fraction))
    return text[:cut], text[cut:]


class LineSubwords:
    """A sentencepiece BPE model over a text stream: each line's subwords, then EOS for its
    newline (fairseq's language-model convention: the subword model never sees a newline).
    ``decode(encode(text)) == text`` for text of characters the model knows."""

    def __init__(self, subwords: Subwords) -> None:
        self.subwords = subwords
        self.pad_id, self.bos_id, self.eos_id = subwords.pad_id, subwords.bos_id, subwords.eos_id

    @property
    def path(self) -> Path | None:
        return self.subwords.path

    @path.setter
    def path(self, path: Path | None) -> None:
        self.subwords.path = path

    @property
    def vocab_size(self) -> int:
        return self.subwords.vocab_size

    def encode(self, text: str) -> list[int]:
        lines = text.split("\n")
        ids: list[int] = []
        for line in lines[:-1]:
            ids += self.subwords.encode(line) + [self.eos_id]
        return ids + self.subwords.encode(lines[-1])

    def decode(self, ids: Sequence[int]) -> str:
        lines, line = [], []
        for i in map(int, ids):
            if i == self.eos_id:
                lines.append(self.subwords.decode(line))
                line = []
            else:
                line.append(i)
        return "\n".join([*lines, self.subwords.decode(line)])


def load_tokenizer(path: str | Path) -> Chars | LineSubwords | PretrainedTokenizer | SentencePieceTokenizer:
    """The tokenizer of the language-model run that ``path`` belongs to (the run directory, a
    checkpoint or a weights file in it): its chars.json, else the pretrained model's
    tokenizer.json or tokenizer.model (``transformer import``; :mod:`.hf_tokenizer`), else its
    subwords.model; looked for in the run directory before a folder above it."""
    found = run_file(path, CHARS_FILE, HF_TOKENIZER, SP_TOKENIZER, SUBWORDS)  # the nearest folder's
    if found is None:
        raise UserError(f"{path}: no {CHARS_FILE} or {SUBWORDS} (nor an imported model's {HF_TOKENIZER}) found beside "
                        "the weights; give the run directory")
    if found.name == CHARS_FILE:
        return Chars.load(found)
    if found.name in (HF_TOKENIZER, SP_TOKENIZER):
        return load_pretrained_tokenizer(found.parent)
    return LineSubwords(Subwords.load(found))


class WindowSampler:
    """Where each training window starts: ``batch_size`` positions drawn uniformly (with
    replacement, as nanoGPT's ``get_batch``) from a generator seeded by ``(seed, g)``, where
    ``g`` counts the micro-batches of all ranks: rank ``r`` of ``W`` draws ``g = k * W + r``
    for its ``k``-th batch. A draw is a function of the position alone, so a restored
    position continues exactly, on the same or (see ``reshard_position``) another number of ranks.

    Random windows have no epochs: ``state_dict()`` is ``{"epoch": 0, "batch_in_epoch": k,
    "seed": seed}`` (the shape of :class:`TokenBatchSampler`'s, which the trainer saves).
    """

    def __init__(self, n_tokens: int, context: int, batch_size: int, seed: int,
                 num_shards: int = 1, shard_index: int = 0) -> None:
        if n_tokens < context + 1:
            raise ValueError(f"a stream of {n_tokens} tokens holds no window of {context} + 1")
        self.n_tokens, self.context, self.batch_size = n_tokens, context, batch_size
        self.seed, self.num_shards, self.shard_index = seed, num_shards, shard_index
        self.batches = 0  # drawn by this rank

    def next_starts(self) -> torch.Tensor:
        """(batch_size,) start positions of the next micro-batch."""
        g = self.batches * self.num_shards + self.shard_index
        rng = np.random.default_rng([self.seed, g])
        self.batches += 1
        return torch.from_numpy(rng.integers(0, self.n_tokens - self.context, self.batch_size))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": 0, "batch_in_epoch": self.batches, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.batches = int(state["seed"]), int(state["batch_in_epoch"])


# The label of a position that is not scored (validation's overlapping windows). Not the
# model's pad_id: an imported model's pad_id can be a real token of its text (GPT-2's).
NOT_SCORED = -100


@dataclass
class TextBatch(Movable):
    """Windows of a token stream: ``x`` (B, T) the model reads, ``y`` (B, T) the next
    tokens (the labels; :data:`NOT_SCORED` marks a position not scored). ``labels``: what
    :func:`~transformer.data.batching.label_positions` says of ``y``, found on the host by
    :meth:`to` before the move (None: found from ``y`` when asked)."""

    x: torch.Tensor
    y: torch.Tensor
    labels: tuple[int, torch.Tensor | None] | None = None
    not_scored = NOT_SCORED  # the label that train_step and validation leave out

    @property
    def inputs(self) -> tuple[torch.Tensor]:
        return (self.x,)

    @property
    def options(self) -> dict:
        """Keywords for the model's forward: a window of the stream holds no padding (only
        labels are ever masked), which spares the model its key mask."""
        return {"padded": False}

    @property
    def tgt_out(self) -> torch.Tensor:
        return self.y

    @property
    def n_tgt_tokens(self) -> int:
        return self._labels()[0]

    @property
    def scored(self) -> torch.Tensor | None:
        """The flat indices of the scored positions, or None when all are (training's windows)."""
        return self._labels()[1]

    def _labels(self) -> tuple[int, torch.Tensor | None]:
        return self.labels if self.labels is not None else label_positions(self.y, NOT_SCORED)

    def _map(self, move) -> TextBatch:
        n, scored = self._labels()  # counted where the batch is, before it moves
        return TextBatch(move(self.x), move(self.y), (n, None if scored is None else move(scored)))


def windows(stream: torch.Tensor, starts: torch.Tensor, context: int) -> TextBatch:
    """The windows of ``stream`` (N,) starting at ``starts`` (B,): x (B, T), y (B, T)."""
    idx = starts[:, None] + torch.arange(context + 1)  # (B, T + 1)
    w = stream[idx]
    return TextBatch(w[:, :-1], w[:, 1:].clone())  # (a label marked NOT_SCORED must not change an input)


def validation_windows(n_tokens: int, context: int) -> list[tuple[int, int]]:
    """Fixed windows that score every token of a stream once (but the first, which nothing
    predicts): non-overlapping windows from position 0, then, when tokens remain, one last
    window ending at the end of the stream that scores only those. Each entry is
    ``(start, first scored position in the window)``."""
    full = (n_tokens - 1) // context
    out = [(k * context, 0) for k in range(full)]
    rest = n_tokens - 1 - full * context
    if rest:
        out.append((n_tokens - 1 - context, context - rest))
    return out
