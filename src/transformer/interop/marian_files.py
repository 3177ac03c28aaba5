"""What Hugging Face reads beside an exported Marian model to translate text out of the box:
the tokenizer files of ``MarianTokenizer`` and the decoding settings of ``generate``.

Tokenizer. ``source.spm`` and ``target.spm`` are both our joint sentencepiece model, and
``vocab.json`` maps each of its pieces to its own id (Marian's vocabularies are usually
not sentencepiece's order; ours is). The model's normaliser travels inside the ``.spm``
file, so a lower-casing model (``lowercase: true``) lower-cases in MarianTokenizer too.
``split_special_tokens`` makes "</s>" typed in a sentence plain text, as our encoder does.
``MarianTokenizer`` then gives ``Subwords.encode(text) + [eos]``. Its decoding differs in
two ways: it strips leading and trailing spaces, and it drops an unknown-word id where ours
writes " ⁇ ". (The other way, :mod:`.marian_run` imports a Marian folder with these files as a
run, and :class:`~transformer.data.marian_tokenizer.MarianSubwords` reads them as
``MarianTokenizer`` does.)

Decoding settings (``generation_config.json``), from the run's ``decoding:`` section:

    beam          num_beams
    alpha         length_penalty, with early_stopping="never" (our beam search's exact
                  stopping rule). HF divides a hypothesis's log-probability by
                  len ** length_penalty, we by GNMT's ((5 + len) / 6) ** alpha: the two
                  rank alike only at 0, so with alpha > 0 a beam output can differ.
    max_len_a/b   max_length: our limit is max_len_a * source length + max_len_b; HF's
                  is one number, so it is max_len_b when max_len_a is 0, else the model's
                  max_len (the longest it can write). Plus one for the start token.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..model.config import ModelConfig
from ..data import Subwords
from ..data.marian_tokenizer import SOURCE_SPM, TARGET_SPM, TOKENIZER_CONFIG, VOCAB
from ..decode.decoding_config import DecodingConfig
from ..run import atomic_write, write_text_atomic
from ._hf import check

SPM_FILES = (SOURCE_SPM, TARGET_SPM)


def tokenizer_config(subwords: Subwords, model_max_length: int, source_lang: str | None = None,
                     target_lang: str | None = None) -> dict:
    """The ``tokenizer_config.json`` of :func:`save_marian_tokenizer`."""
    piece = subwords.id_to_piece
    return {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": source_lang,
        "target_lang": target_lang,
        "unk_token": piece(subwords.unk_id),
        "eos_token": piece(subwords.eos_id),
        "pad_token": piece(subwords.pad_id),
        "bos_token": piece(subwords.bos_id),  # special, so that decoding skips it (Marian never adds it)
        "separate_vocabs": False,
        "split_special_tokens": True,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,  # it would turn "a ." into "a."; ours keeps the text
    }


def marian_vocab(subwords: Subwords) -> dict[str, int]:
    """``vocab.json``: every piece to its id. ValueError if two ids share a piece."""
    vocab = {p: i for i, p in enumerate(subwords.vocab())}
    check(len(vocab) == subwords.vocab_size, "save_marian", "the subword model has repeated pieces")
    return vocab


def save_marian_tokenizer(subwords: Subwords, out_dir: str | Path, model_max_length: int,
                          source_lang: str | None = None, target_lang: str | None = None) -> list[Path]:
    """Write the files ``MarianTokenizer.from_pretrained(out_dir)`` reads (``source.spm``,
    ``target.spm``, ``vocab.json``, ``tokenizer_config.json``). Returns the paths written."""
    out_dir = Path(out_dir)
    model = subwords.to_bytes()  # the .model file's bytes
    written = [atomic_write(out_dir / name, lambda tmp: Path(tmp).write_bytes(model)) for name in SPM_FILES]
    written.append(write_text_atomic(out_dir / VOCAB, json.dumps(marian_vocab(subwords), ensure_ascii=False,
                                                                 indent=0) + "\n"))
    config = tokenizer_config(subwords, model_max_length, source_lang, target_lang)
    text = json.dumps(config, ensure_ascii=False, indent=2) + "\n"
    written.append(write_text_atomic(out_dir / TOKENIZER_CONFIG, text))
    return written


def generation_settings(decoding: DecodingConfig, cfg: ModelConfig) -> dict:
    """The ``GenerationConfig`` fields for our decoding settings (see the module docstring).
    The beam-only ones are left out at beam 1, where HF refuses to save them."""
    limit = min(decoding.max_len_b, cfg.max_len) if decoding.max_len_a == 0 else cfg.max_len
    settings = {"num_beams": decoding.beam, "max_length": max(limit, 1) + 1}  # + the start token
    if decoding.beam > 1:
        settings.update(length_penalty=decoding.alpha, early_stopping="never")
    return settings


def differences(decoding: DecodingConfig) -> list[str]:
    """Where ``generate`` with :func:`generation_settings` can give other output than ours,
    in a few words each (empty when it cannot)."""
    found = []
    if decoding.beam > 1 and decoding.alpha != 0:
        found.append(f"HF's length penalty is len**{decoding.alpha:g}, not ((5 + len) / 6)**{decoding.alpha:g}")
    if decoding.max_len_a != 0:
        found.append("HF's length limit is the model's max_len, not max_len_a * source length + max_len_b")
    return found
