"""A character vocabulary, as nanoGPT's shakespeare_char builds it: the sorted set of the
characters of the whole text, one id each.

The ids are offset by 3 so that pad=0, bos=1 and eos=2 stay reserved as in every model of
this project: the text's i-th character (in sorted order) is id ``3 + i``. Stored as JSON
(``{"chars": [...]}``, in id order from 3) in the run directory, e.g. ``RUN/chars.json``.

A character the text did not hold has no id: :meth:`Chars.encode` raises a one-line
UserError that names it (there is no ``unk`` id to map it to).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..errors import UserError
from ..run.files import write_text_atomic
from .subwords import BOS_ID, EOS_ID, PAD_ID

__all__ = ["Chars", "FIRST_ID", "CHARS_FILE"]

FIRST_ID = 3  # ids 0, 1, 2 are pad, bos, eos
CHARS_FILE = "chars.json"  # its name in a run directory


class Chars:
    """Text <-> character ids. ``encode`` adds no BOS/EOS; ``decode`` drops pad/BOS/EOS."""

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, chars: Sequence[str], path: Path | None = None) -> None:
        self.chars = list(chars)
        self.path = path
        self._ids = {c: FIRST_ID + i for i, c in enumerate(self.chars)}

    @classmethod
    def learn(cls, text: str) -> Chars:
        """The vocabulary of ``text``: its distinct characters, sorted (by code point)."""
        return cls(sorted(set(text)))

    @classmethod
    def load(cls, path: str | Path) -> Chars:
        path = Path(path)
        try:
            chars = json.loads(path.read_text(encoding="utf-8"))["chars"]
        except FileNotFoundError:
            raise UserError(f"{path}: character vocabulary not found") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{path}: not a character vocabulary ({type(e).__name__}: {e})") from None
        if not (isinstance(chars, list) and all(isinstance(c, str) and len(c) == 1 for c in chars)):
            raise UserError(f"{path}: 'chars' must be a list of single characters")
        return cls(chars, path)

    def save(self, path: str | Path) -> Path:
        """Write the vocabulary atomically (JSON, one character per entry, in id order)."""
        self.path = write_text_atomic(Path(path), json.dumps({"chars": self.chars}, ensure_ascii=False) + "\n")
        return self.path

    @property
    def vocab_size(self) -> int:
        """Number of ids, the three reserved ones included."""
        return FIRST_ID + len(self.chars)

    def encode(self, text: str) -> list[int]:
        """The id of each character of ``text``.

        Raises:
            UserError: ``text`` holds a character the vocabulary does not (named, with its code point).
        """
        try:
            return [self._ids[c] for c in text]
        except KeyError as e:
            c = e.args[0]
            where = f" of {self.path}" if self.path else ""
            raise UserError(f"character {c!r} (U+{ord(c):04X}) is not in the character vocabulary{where}; "
                            "it holds only the characters of the training text") from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; pad, BOS and EOS are dropped."""
        return "".join(self.chars[i - FIRST_ID] for i in map(int, ids) if i >= FIRST_ID)
