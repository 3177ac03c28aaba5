"""The tokenizer of a Marian (OPUS-MT) model: two sentencepiece models and a vocabulary
that numbers their pieces, read as Hugging Face's ``MarianTokenizer`` reads them.

A Marian folder (and a run imported from one, :mod:`transformer.interop.marian_run`) holds:

    source.spm              sentencepiece model that cuts source text into pieces
    target.spm              the target language's; it cuts a target text (a forced translation)
    vocab.json              piece -> id, for both sides (shared embeddings), or the source side
    target_vocab.json       piece -> id of the target side, when the vocabularies are separate
    tokenizer_config.json   separate_vocabs, the special tokens, clean_up_tokenization_spaces

The ids are the vocabulary's, not sentencepiece's: a piece is looked up in ``vocab.json``,
and one missing from it is ``<unk>``. Marian's conventions, as ``MarianTokenizer`` (transformers 5)
has them:

- encoding appends no BOS (:class:`~transformer.inference.translator.Translator` appends ``</s>``);
  a text that starts with a language code (``>>fra<<``) keeps the code as one token; the
  special tokens (``</s>``, ``<unk>``, ``<pad>``) written in a text are those tokens, and
  each stretch of text between them is cut by sentencepiece on its own;
- decoding drops the special tokens (``skip_special_tokens=True``, as HF's translation
  pipeline does; an unknown word is dropped too, where :class:`~transformer.data.Subwords`
  writes " ⁇ "), joins the pieces with the source model when the vocabulary is shared and
  with the target model when it is separate (as HF does), and strips the ends;
- decoding starts from ``<pad>`` (``decoder_start_token_id``): the model's ``bos_id`` is
  its ``pad_id``, and ``bos_id`` here is ``pad_id`` too.

Only the standard library and sentencepiece: translating with an imported model needs no
``transformers``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from ..errors import UserError
from .hf_tokenizer import read_json
from .subwords import read_sentencepiece

__all__ = ["MarianSubwords", "SOURCE_SPM", "TARGET_SPM", "VOCAB", "TARGET_VOCAB", "TOKENIZER_CONFIG",
           "MARIAN_FILES"]

SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG = "vocab.json", "target_vocab.json", "tokenizer_config.json"
MARIAN_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB)  # what every Marian tokenizer needs
WORD_START = "\u2581"
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))  # HF's clean_up_tokenization


class MarianSubwords:
    """Text <-> ids for a Marian model, with the interface of :class:`~transformer.data.Subwords`
    that translation uses (``encode`` for the source side, ``decode`` for the target side,
    ``vocab_size`` of the target side, ``pad_id`` / ``bos_id`` / ``eos_id`` / ``unk_id``).
    Build one with :meth:`load` on a folder holding the files of the module docstring."""

    def __init__(self, source: spm.SentencePieceProcessor, target: spm.SentencePieceProcessor,
                 vocab: dict[str, int], target_vocab: dict[str, int] | None, config: dict,
                 path: Path | None = None) -> None:
        self._source, self._target = source, target
        self.separate = target_vocab is not None
        self._src_vocab = vocab
        self._tgt_vocab = target_vocab if target_vocab is not None else vocab
        self._tgt_pieces = {i: p for p, i in self._tgt_vocab.items()}
        self._src_pieces = {i: p for p, i in vocab.items()}
        self.path = path
        where = path or "Marian tokenizer"
        names = {k: str(config.get(f"{k}_token") or default) for k, default in
                 (("unk", "<unk>"), ("eos", "</s>"), ("pad", "<pad>"))}
        for side, v in (("source", self._src_vocab), ("target", self._tgt_vocab)):
            for kind, token in names.items():
                if token not in v:
                    raise UserError(f"{where}: the {side} vocabulary has no {kind} token {token!r}")
        for kind in ("eos", "pad"):
            if self._tgt_vocab[names[kind]] != vocab[names[kind]]:
                raise UserError(f"{where}: the source and target vocabularies give {names[kind]} different "
                                "ids; the model has one of each")
        self.unk_id, self.eos_id, self.pad_id = (vocab[names[k]] for k in ("unk", "eos", "pad"))
        self.bos_id = self.pad_id  # decoding starts from <pad> (decoder_start_token_id)
        extra = config.get("additional_special_tokens") or []
        specials = [*names.values(), *(t for t in extra if isinstance(t, str))]
        self._special_pieces = set(specials)
        # longest first: a special token inside a longer one is not matched alone
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(set(specials), key=len,
                                                                            reverse=True)) + ")")
        self._skip = {self._tgt_vocab[t] for t in specials if t in self._tgt_vocab}
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        # HF joins target pieces with the source model unless the vocabularies are separate
        self._joiner = target if self.separate else source

    @classmethod
    def load(cls, folder: str | Path) -> "MarianSubwords":
        """Read a Marian tokenizer's files from ``folder``. UserError (one line) when one is
        missing or unreadable."""
        folder = Path(folder)
        for name in MARIAN_FILES:
            if not (folder / name).is_file():
                raise UserError(f"{folder}: no {name}; a Marian tokenizer needs {', '.join(MARIAN_FILES)}")
        config_file = folder / TOKENIZER_CONFIG
        config = read_json(config_file, "not a readable JSON file") if config_file.is_file() else {}
        if not isinstance(config, dict):
            raise UserError(f"{folder / TOKENIZER_CONFIG}: not a JSON object")
        separate = bool(config.get("separate_vocabs", False))
        if separate and not (folder / TARGET_VOCAB).is_file():
            raise UserError(f"{folder}: {TOKENIZER_CONFIG} says separate_vocabs but there is no {TARGET_VOCAB}")
        vocab = _read_vocab(folder / VOCAB)
        target_vocab = _read_vocab(folder / TARGET_VOCAB) if separate else None
        return cls(read_sentencepiece(folder / SOURCE_SPM), read_sentencepiece(folder / TARGET_SPM), vocab,
                   target_vocab, config, folder)

    # ---- text -> ids ----------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Source ids of ``text``, without ``</s>`` (``MarianTokenizer(text).input_ids[:-1]``)."""
        return self._ids(self.pieces(text), self._src_vocab)

    def encode_target(self, text: str) -> list[int]:
        """Target ids of ``text`` (a translation to force), without ``</s>``."""
        return self._ids(self._pieces(text, self._target), self._tgt_vocab)

    def pieces(self, text: str) -> list[str]:
        """The source pieces of ``text`` ("▁" marks a space), for display."""
        return self._pieces(text, self._source)

    def _pieces(self, text: str, model: spm.SentencePieceProcessor) -> list[str]:
        out: list[str] = []
        for part in self._split.split(text):
            if part in self._special_pieces:
                out.append(part)
            elif part:
                code = _language_code(part)
                if code:
                    out.append(code)
                    part = part[len(code):]
                out += model.encode(part, out_type=str)
        return out

    def _ids(self, pieces: list[str], vocab: dict[str, int]) -> list[int]:
        return [vocab.get(p, self.unk_id) for p in pieces]

    # ---- ids -> text ----------------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        """Text of target ids (``MarianTokenizer.decode(ids, skip_special_tokens=True)``):
        special tokens, ``<unk>`` among them, are dropped."""
        pieces = [self.id_to_piece(int(i)) for i in ids if int(i) not in self._skip]
        text = self._joiner.decode_pieces(pieces).replace(WORD_START, " ").strip()
        if self._clean_up:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    def id_to_piece(self, i: int) -> str:
        """The piece of target id ``i`` (with a shared vocabulary, of source id ``i`` too)."""
        piece = self._tgt_pieces.get(i)
        if piece is None:  # as HF: an id the vocabulary lacks is looked up in the joining model
            piece = self._joiner.id_to_piece(i) if 0 <= i < self._joiner.get_piece_size() else ""
        return piece or self.id_to_piece(self.unk_id)

    def source_piece(self, i: int) -> str:
        """The piece of source id ``i`` (differs from :meth:`id_to_piece` only with separate
        vocabularies): labels for the encoder's side."""
        return self._src_pieces.get(i) or self.id_to_piece(self.unk_id)

    def is_normal(self, i: int) -> bool:
        """Whether target id ``i`` is text (not a special token)."""
        return i not in self._skip

    def vocab(self) -> list[str]:
        """The target pieces in id order."""
        return [self.id_to_piece(i) for i in range(self.vocab_size)]

    @property
    def vocab_size(self) -> int:
        """Number of target ids (the decoder's vocabulary)."""
        return max(self._tgt_vocab.values()) + 1

    @property
    def source_vocab_size(self) -> int:
        """Number of source ids (the encoder's vocabulary)."""
        return max(self._src_vocab.values()) + 1

    @property
    def lowercases(self) -> bool:
        """Whether the source model lower-cases its input."""
        return "A" not in self._source.normalize("A")


def _language_code(text: str) -> str:
    """A ``>>xx<<`` language code at the start of ``text`` (as MarianTokenizer finds it), or ''."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return text[: end + 2]
    return ""


def _read_vocab(path: Path) -> dict[str, int]:
    vocab = read_json(path, "not a readable JSON file")
    if not (isinstance(vocab, dict) and vocab and all(isinstance(i, int) and i >= 0 for i in vocab.values())):
        raise UserError(f"{path}: not a vocabulary (a JSON object of piece: id, ids 0 or more)")
    return vocab
