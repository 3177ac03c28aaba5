"""The tokenizer a pretrained model was trained with, as a run directory keeps it after
``transformer import``: Hugging Face's ``tokenizer.json`` (read by the ``tokenizers``
library: byte-level BPE for GPT-2, Llama 3 and Qwen; Llama 2's sentencepiece BPE as
converted by HF), or a sentencepiece ``tokenizer.model`` (Llama 2 without a tokenizer.json).
Beside it, ``tokenizer_config.json`` says what HF's ``AutoTokenizer`` adds around the text.

Both have the interface of the project's tokenizers (``vocab_size``, ``encode``, ``decode``):

- ``encode(text)`` gives the ids ``AutoTokenizer.from_pretrained(...)(text)`` gives: with
  the special tokens the model expects around a text (Llama's BOS; GPT-2 and Qwen add none).
- ``decode(ids)`` gives ``AutoTokenizer.decode(ids, skip_special_tokens=True)``: the text,
  without BOS, EOS or padding. Ids that end inside a multi-byte character decode to
  U+FFFD there, which streamed decoding (:class:`~transformer.inference.generator.TextPieces`) holds back.
- ``shown(i)`` gives one token as the pictures of a model's tokens show it (explain, attention,
  the service's attention map): its text, or its own name where that is nothing (a special
  token: ``<|begin_of_text|>``) or part of a character (a byte: ``<0xF0>``).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError

HF_TOKENIZER = "tokenizer.json"
SP_TOKENIZER = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"


def _clean_up(text: str) -> str:
    """HF's ``clean_up_tokenization``: no space before punctuation and English contractions
    (applied only where the tokenizer's config asks for it, as HF does)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


def _tokenizer_config(folder: Path) -> dict:
    path = folder / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    data = read_json(path, "not a readable tokenizer config")
    return data if isinstance(data, dict) else {}


def read_json(path: Path, unreadable: str = "not readable JSON"):
    """The JSON value in ``path``; UserError ``<path>: <unreadable> (<why>)`` when the file
    cannot be read or parsed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: bad UTF-8, bad JSON, a number of over 4,300 digits
        raise UserError(f"{path}: {unreadable} ({e})") from None


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's ``bytes_to_unicode``): the
    printable Latin-1 bytes stand for themselves, the others for chr(256), chr(257), ..."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + n): b for n, b in enumerate(others)}}


BYTE_LEVEL = _byte_level_alphabet()


def _shown_bytes(data: bytes) -> str:
    """UTF-8 bytes as text, each byte that is no whole character as ``<0xF0>`` (sentencepiece's
    name for a byte piece)."""
    out = []
    while data:
        try:
            out.append(data.decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            out.append(data[:e.start].decode("utf-8") + f"<0x{data[e.start]:02X}>")
            data = data[e.start + 1:]
    return "".join(out)


class PretrainedTokenizer:
    """A ``tokenizer.json`` through the ``tokenizers`` library (module docstring)."""

    def __init__(self, path: str | Path) -> None:
        from ..extras import require

        Tokenizer = require("tokenizers", "interop", f"{path} (a Hugging Face tokenizer.json)").Tokenizer

        self.path = Path(path)
        try:
            self.tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as e:  # the library raises its own Exception subclass for a bad file
            raise UserError(f"{self.path}: not a readable tokenizer.json ({e})") from None
        self.clean_up = bool(_tokenizer_config(self.path.parent).get("clean_up_tokenization_spaces", False))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def special_ids(self) -> list[int]:
        """The ids of the special tokens (BOS, EOS, padding, reserved ones): text never encodes
        to them unless it spells them out."""
        return sorted(i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
        return _clean_up(text) if self.clean_up else text

    def shown(self, i: int) -> str:
        """Token ``i`` on its own (module docstring): a byte-level piece's bytes decoded, where
        its text is part of a character; a special token's name."""
        text = self.decode([i])
        if text and "\ufffd" not in text:
            return text
        piece = self.tokenizer.id_to_token(int(i)) or f"<unused_{int(i)}>"  # Qwen pads its embedding beyond us
        return _shown_bytes(bytes(BYTE_LEVEL[c] for c in piece)) if all(c in BYTE_LEVEL for c in piece) else piece


class SentencePieceTokenizer:
    """A sentencepiece ``tokenizer.model`` (Llama 2), with BOS / EOS added as
    ``tokenizer_config.json`` says (``add_bos_token``, default on; ``add_eos_token``, default off)."""

    def __init__(self, path: str | Path) -> None:
        import sentencepiece as spm

        self.path = Path(path)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.Load(str(self.path))
        except (OSError, RuntimeError) as e:
            raise UserError(f"{self.path}: not a readable sentencepiece model ({e})") from None
        config = _tokenizer_config(self.path.parent)
        self.add_bos = bool(config.get("add_bos_token", True)) and self.sp.bos_id() >= 0
        self.add_eos = bool(config.get("add_eos_token", False)) and self.sp.eos_id() >= 0

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        ids = self.sp.encode(text)
        return [self.sp.bos_id()] * self.add_bos + ids + [self.sp.eos_id()] * self.add_eos

    def decode(self, ids: Sequence[int]) -> str:
        n = self.vocab_size
        return self.sp.decode([int(i) for i in ids if 0 <= int(i) < n and not self.sp.is_control(int(i))])

    def shown(self, i: int) -> str:
        """Token ``i`` on its own (module docstring): its piece (``<s>``, ``<0xF0>``, a lone
        "▁" as a space) where its text is nothing or part of a character."""
        text = self.decode([i])
        return text if text and "\ufffd" not in text else self.sp.id_to_piece(int(i)).replace("▁", " ")


def load_pretrained_tokenizer(folder: str | Path) -> PretrainedTokenizer | SentencePieceTokenizer | None:
    """The tokenizer an imported run keeps in ``folder``; None when it has neither file."""
    folder = Path(folder)
    if (folder / HF_TOKENIZER).is_file():
        return PretrainedTokenizer(folder / HF_TOKENIZER)
    if (folder / SP_TOKENIZER).is_file():
        return SentencePieceTokenizer(folder / SP_TOKENIZER)
    return None
