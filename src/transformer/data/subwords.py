"""A joint source/target subword vocabulary: sentencepiece BPE with fixed special ids.

Special ids are fixed to match the model's defaults: ``pad=0, bos=1, eos=2, unk=3``.

Round trip. The model is trained with ``normalization_rule_name="identity"`` and
``remove_extra_whitespaces=False``, so ``decode(encode(s)) == s`` for every string made of
characters seen in training. That includes leading, trailing and repeated spaces (each
space becomes its own "▁" when it cannot merge), German umlauts, ß and punctuation; no
Unicode normalisation (NFKC) is applied, so e.g. a full-width comma stays full-width.
What is *not* preserved: a character never seen in training encodes to ``unk`` and decodes
as " ⁇ "; tabs and other control characters are unknown unless the training text held them.

Lower-casing. ``train_subwords(..., lowercase=True)`` compiles a rule that maps every
character to ``str.lower()`` of it into the model's normaliser, so the model itself lower-cases
whatever it encodes: training text, validation text and every later input to ``translate``,
``evaluate`` or the server, with no separate step to forget. ``decode`` then gives lower-case
text. Python's ``lower`` keeps German ß (Unicode case folding, sentencepiece's ``*_cf`` rules,
would turn it into "ss"). The published Multi30k systems were trained on lower-cased text.

Determinism. Training reads every sentence (``input_sentence_size=0``: no sampling) with one
thread, so the same texts and vocabulary size give the same pieces, scores and encodings.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from ..errors import UserError

__all__ = ["Subwords", "train_subwords", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID"]

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def read_sentencepiece(path: Path, advice: str = "") -> spm.SentencePieceProcessor:
    """The sentencepiece model stored in ``path``; UserError when the file is not one
    (``advice``, what to do about it, ends the message)."""
    processor = spm.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (RuntimeError, OSError) as e:
        raise UserError(f"{path}: not a valid sentencepiece model ({e}){advice}") from None
    return processor


class Subwords:
    """A loaded sentencepiece model: text <-> subword ids.

    Build one with :func:`train_subwords` or :meth:`load`. Ids are plain ``int``s; ``encode``
    adds no BOS/EOS (the batch collate does that) and ``decode`` drops pad/BOS/EOS ids.
    ``pad_id``, ``bos_id``, ``eos_id`` and ``unk_id`` are the special ids, read from the model.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None):
        self._sp = processor
        self.path = path
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (
            processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id())
        for name in ("pad_id", "bos_id", "eos_id", "unk_id"):
            if getattr(self, name) < 0:
                where = path or "subword model"
                raise UserError(f"{where}: has no {name.removesuffix('_id')} token; train it with train_subwords")
        self._specials = {self.pad_id, self.bos_id, self.eos_id}

    @classmethod
    def load(cls, path: str | Path) -> Subwords:
        """Load a ``.model`` file written by :func:`train_subwords`.

        Raises:
            UserError: the file is missing or is not a sentencepiece model.
        """
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path}: subword model not found; train one first or check the path")
        return cls(read_sentencepiece(path, "; retrain or re-copy it"), path)

    @classmethod
    def from_bytes(cls, data: bytes) -> Subwords:
        """Load a model from :meth:`to_bytes` output (e.g. stored inside a checkpoint)."""
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(data)
        except (RuntimeError, OSError) as e:
            raise UserError(f"stored subword model is corrupt ({e}); retrain it") from None
        return cls(processor)

    def to_bytes(self) -> bytes:
        """The serialized model, to store beside the weights so translation tokenises as training did."""
        return self._sp.serialized_model_proto()

    def encode(self, text: str) -> list[int]:
        """Subword ids of ``text``, without BOS/EOS."""
        return self._sp.encode(text, out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; pad, BOS and EOS ids are ignored, unknown ids become " ⁇ "."""
        return self._sp.decode([int(i) for i in ids if int(i) not in self._specials])

    def pieces(self, text: str) -> list[str]:
        """The subword strings of ``text`` ("▁" marks a space), for display."""
        return self._sp.encode(text, out_type=str)

    def id_to_piece(self, i: int) -> str:
        """The subword string of id ``i``."""
        return self._sp.id_to_piece(i)

    def score(self, i: int) -> float:
        """The score of piece ``i``; for BPE, minus the rank of the merge that made it."""
        return self._sp.get_score(i)

    def is_normal(self, i: int) -> bool:
        """Whether piece ``i`` is text (not pad / BOS / EOS / unknown)."""
        return not (self._sp.is_control(i) or self._sp.is_unknown(i) or self._sp.is_unused(i))

    def vocab(self) -> list[str]:
        """All pieces in id order (index ``i`` holds ``id_to_piece(i)``)."""
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

    @property
    def lowercases(self) -> bool:
        """Whether the model lower-cases its input (trained with ``lowercase=True``)."""
        return "A" not in self._sp.normalize("A")

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._sp.get_piece_size()


def train_subwords(
    texts: Iterable[str],
    model_prefix: str | Path,
    vocab_size: int = 8000,
    *,
    max_sentence_bytes: int = 4192,
    lowercase: bool = False,
) -> Subwords:
    """Train a joint BPE vocabulary on ``texts`` (source and target sentences together).

    Writes ``<model_prefix>.model`` and ``<model_prefix>.vocab`` and returns the loaded model.
    Empty texts are skipped; sentences longer than ``max_sentence_bytes`` (UTF-8) are left out
    of training but can still be encoded later. ``lowercase=True`` builds a model that
    lower-cases everything it encodes (see the module's docstring).

    Raises:
        UserError: no non-empty text, or ``vocab_size`` too large for the text (the message
            says the largest size the text allows).
    """
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "subword_corpus.txt"
        n = 0
        with corpus.open("w", encoding="utf-8", newline="\n") as f:
            for text in texts:
                if text:
                    f.write(text.replace("\n", " ") + "\n")
                    n += 1
        if n == 0:
            raise UserError("cannot train a subword vocabulary: no non-empty sentences given")
        normaliser = {"normalization_rule_name": "identity"}
        if lowercase:
            rules = Path(tmp) / "lowercase.tsv"
            rules.write_text(_lowercase_rules(), encoding="utf-8")
            normaliser = {"normalization_rule_tsv": str(rules)}
        try:
            spm.SentencePieceTrainer.train(
                input=str(corpus),
                model_prefix=str(model_prefix),
                vocab_size=vocab_size,
                model_type="bpe",
                character_coverage=1.0,
                **normaliser,
                remove_extra_whitespaces=False,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                input_sentence_size=0,
                shuffle_input_sentence=False,
                num_threads=1,
                max_sentence_length=max_sentence_bytes,
                minloglevel=2,
            )
        except RuntimeError as e:
            raise UserError(_vocab_size_error(str(e), vocab_size)) from None
    return Subwords.load(model_prefix.with_name(model_prefix.name + ".model"))


def _vocab_size_error(message: str, vocab_size: int) -> str:
    """sentencepiece's refusal of ``vocab_size`` in words: too large says the largest the
    text allows, too small the fewest pieces it needs (its characters and 4 special ones)."""
    if m := re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message):
        return (f"vocab_size {vocab_size} is more subwords than this text holds (at most {m[1]}); "
                f"lower vocab_size to {m[1]} or less")
    if m := re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", message):
        return (f"vocab_size {vocab_size} is fewer than this text's {m[1]} distinct characters and special "
                f"pieces; raise vocab_size to {m[1]} or more")
    return f"subword training failed: {message}; try another vocab_size"


def _lowercase_rules() -> str:
    """A sentencepiece normalisation table (hex code points, tab, hex code points) mapping
    every character whose ``str.lower()`` differs to that lower-case form."""
    rows = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:  # surrogates are not characters
            continue
        c = chr(cp)
        low = c.lower()
        if low != c:
            rows.append(f"{cp:X}\t{' '.join(f'{ord(x):X}' for x in low)}\n")
    return "".join(rows)
