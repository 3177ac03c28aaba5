"""Training data for a run: read the corpus, learn (or reload) the subwords, encode, filter;
and the run directory's own files before the first update (subwords or chars.json, config.yaml).

A language model's text (:func:`prepare_text`) becomes two token streams: the first
``1 - valid_fraction`` of the text for training, the rest for validation. A language model
fine-tuned with ``init_from`` encodes it with its source's tokenizer, whose files
(:func:`copy_tokenizer`) the run directory holds instead of a vocabulary of its own."""
from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from ..data import (Subwords, clean_pairs, filter_long, hold_out, load_multi30k, read_parallel, read_tsv,
                    train_subwords)
from ..data.chars import CHARS_FILE as CHARS
from ..data.chars import Chars
from ..data.hf_tokenizer import HF_TOKENIZER, SP_TOKENIZER, TOKENIZER_CONFIG
from ..data.registry import load_multi30k_text, tinyshakespeare_path
from ..data.text import LineSubwords, load_tokenizer, read_text, read_texts, split_text
from ..errors import UserError
from ..run.files import atomic_write, file_sha256, write_text_atomic
from ..run.layout import CONFIG, SUBWORDS, SUBWORDS_VOCAB, remove_stale_files
from .train_config import TrainConfig


# A language model's tokenizer files, as a run (of ours, or imported) holds them: a fine-tune
# copies whichever its source has. MAIN_TOKENIZER_FILES: the one that stands for the
# tokenizer (its checksum is in each checkpoint), in the order load_tokenizer looks.
MAIN_TOKENIZER_FILES = (CHARS, HF_TOKENIZER, SP_TOKENIZER, SUBWORDS)
TOKENIZER_FILES = (*MAIN_TOKENIZER_FILES, SUBWORDS_VOCAB, TOKENIZER_CONFIG, "special_tokens_map.json")


@dataclass
class PreparedData:
    subwords: Subwords
    train: list[tuple[list[int], list[int]]]  # encoded (src, tgt) pairs, no BOS/EOS
    valid: list[tuple[str, str]]  # raw text pairs, for loss and BLEU
    n_empty: int  # training pairs skipped because a side was empty
    n_too_long: int  # training pairs longer than the model's max_len


@dataclass
class PreparedText:
    tokenizer: Chars | LineSubwords
    train: torch.Tensor  # (N,) token ids of the training part of the text
    valid: torch.Tensor  # (M,) token ids of the validation part (empty with valid_fraction 0)


def tokenizer_file(cfg: TrainConfig, run_dir: Path) -> Path:
    """The run's vocabulary file: chars.json for tokenizer chars, else subwords.model; a
    fine-tuned language model's: the main file of the tokenizer copied from its source (the
    first of :data:`MAIN_TOKENIZER_FILES` it holds; chars.json before the copy)."""
    run_dir = Path(run_dir)
    if cfg.is_language_model and cfg.init_from:
        return next((run_dir / n for n in MAIN_TOKENIZER_FILES if (run_dir / n).is_file()), run_dir / CHARS)
    return run_dir / (CHARS if cfg.is_language_model and cfg.tokenizer == "chars" else SUBWORDS)


def copy_tokenizer(found: dict[str, Path], run_dir: Path, log=print) -> None:
    """A fine-tuned language model's tokenizer: the source's files (name -> path) copied into
    ``run_dir``, the main one last (its presence means complete). A file already there must be
    the same (a run directory of another tokenizer is refused)."""
    names = sorted(found, key=lambda name: name in MAIN_TOKENIZER_FILES)
    for name in names:
        source, target = found[name], Path(run_dir) / name
        if not target.is_file():
            atomic_write(target, lambda tmp, f=source: shutil.copyfile(f, tmp))
        elif file_sha256(target) != file_sha256(source):
            raise UserError(f"{target} is not the {name} of init_from ({source}); use another --out directory")
    log(f"init_from: the tokenizer of {found[names[-1]].parent} ({', '.join(sorted(found))}) -> {run_dir}")


# The keys naming a run's own data files: read again at every start, so a resume checks them
# by content (a checkpoint records their checksums), not by how the path is spelled.
DATA_FILES = ("train_src", "train_tgt", "valid_src", "valid_tgt", "text_files")


def data_checksums(cfg: TrainConfig) -> dict[str, str | list[str] | None]:
    """The SHA-256 of each file the keys of :data:`DATA_FILES` name (a list for text_files),
    by key; None for a file that is not there. Empty for a dataset of the registry."""
    def sha(path: str) -> str | None:
        if not Path(path).is_file():
            return None
        with open(path, "rb") as f:  # block by block: a corpus can be large
            return hashlib.file_digest(f, "sha256").hexdigest()

    out: dict[str, str | list[str] | None] = {}
    for key in DATA_FILES:
        value = getattr(cfg, key)
        if value:
            out[key] = [sha(p) for p in value] if isinstance(value, list) else sha(value)
    return out


def text_paths(cfg: TrainConfig, download: bool = True) -> list[Path]:
    if cfg.dataset == "tinyshakespeare":
        return [tinyshakespeare_path(cfg.data_dir, download=download)]
    for given in cfg.text_files:  # "a.txt,b.txt" or "a.txt b.txt": several files given as one
        parts = given.replace(",", " ").split()
        if not Path(given).exists() and len(parts) > 1 and all(Path(p).is_file() for p in parts):
            raise UserError(f"text_files: {given}: file not found; several files are a list: "
                            f"text_files: [{', '.join(parts)}] (--set 'text_files=[{', '.join(parts)}]')")
    return [Path(p) for p in cfg.text_files]


def read_lm_text(cfg: TrainConfig, download: bool = True) -> tuple[str, str, str]:
    """A language model's training text, validation text and the name of their source:
    Multi30k's own train / val sentences of ``tgt_lang`` for ``multi30k-mono``, else the
    files read as one text and split contiguously by ``valid_fraction``."""
    if cfg.dataset == "multi30k-mono":
        train, valid = (load_multi30k_text(split, cfg.tgt_lang, cfg.data_dir, download) for split in ("train", "val"))
        return train, valid, f"multi30k {cfg.tgt_lang}"
    paths = text_paths(cfg, download)
    return *split_text(read_texts(paths), cfg.valid_fraction), ", ".join(map(str, paths))


def prepare_text(cfg: TrainConfig, run_dir: Path, context: int, log=print, download: bool = True) -> PreparedText:
    """A language model's streams. The vocabulary is learned once and kept in the run
    directory: characters from the whole text (as nanoGPT, so validation has no unknown
    character), BPE from the training part only."""
    train_text, valid_text, names = read_lm_text(cfg, download)
    text = train_text + valid_text
    path = tokenizer_file(cfg, run_dir)
    if cfg.init_from:  # the source's, copied in by prepare_run
        tokenizer = load_tokenizer(path)
        if isinstance(tokenizer, Chars):
            _check_chars(cfg, tokenizer, text, download)
    elif cfg.tokenizer == "chars":
        tokenizer = Chars.load(path) if path.is_file() else Chars.learn(text)
        if tokenizer.path is None:
            tokenizer.save(path)
            log(f"{len(tokenizer.chars)} distinct characters -> {path}")
    elif path.is_file():
        tokenizer = LineSubwords(Subwords.load(path))
    else:
        tokenizer = LineSubwords(train_subwords(train_text.split("\n"), path.with_suffix(""), cfg.vocab_size))
        log(f"learned a BPE vocabulary of {tokenizer.vocab_size} subwords -> {path}")
    train, valid = (torch.tensor(tokenizer.encode(t), dtype=torch.long) for t in (train_text, valid_text))
    for part, stream in (("training part", train), ("validation part", valid)):
        if len(stream) < 2 * context + 1 and (part == "training part" or valid_text):
            # the validation part of a text of one's own is sized by valid_fraction (multi30k-mono: its val split)
            split = (f", a larger valid_fraction (now {cfg.valid_fraction:g}), or valid_fraction: 0 for none"
                     if part == "validation part" and cfg.dataset != "multi30k-mono" else "")
            raise UserError(f"{names}: the {part} of the text holds {len(stream)} tokens, fewer than two context "
                            f"windows ({2 * context} + 1); give a longer text, a shorter context{split}")
    kind = f"the tokenizer of init_from ({path.name})" if cfg.init_from else cfg.tokenizer
    log(f"text: {len(text):,} characters; {len(train):,} training and {len(valid):,} validation tokens "
        f"({kind}, vocabulary {tokenizer.vocab_size})")
    return PreparedText(tokenizer, train, valid)


def _check_chars(cfg: TrainConfig, chars: Chars, text: str, download: bool) -> None:
    """A fine-tune's text holds only its source's characters: the first one it lacks is
    refused with its file, line and column (Chars.encode names only the vocabulary)."""
    unknown = set(text) - set(chars.chars)
    if not unknown:
        return
    texts = ([(f"multi30k {cfg.tgt_lang}", text)] if cfg.dataset == "multi30k-mono" else
             [(str(p), read_text(p)) for p in text_paths(cfg, download)])
    for name, part in texts:
        found = [i for i in (part.find(c) for c in unknown) if i >= 0]
        if found:
            i = min(found)
            c, line, column = part[i], part.count("\n", 0, i) + 1, i - part.rfind("\n", 0, i)
            raise UserError(f"{name}:{line}: character {c!r} (U+{ord(c):04X}) at column {column} is not one of the "
                            f"{len(chars.chars)} characters of init_from {cfg.init_from} (its {CHARS}), the only ones "
                            "its model reads; replace or remove it (and any other the text holds beyond them)")


def _read_pairs(cfg: TrainConfig, split: str, download: bool = True) -> list[tuple[str, str]]:
    if cfg.dataset == "multi30k":
        name = {"train": "train", "valid": "val"}[split]
        return load_multi30k(name, cfg.src_lang, cfg.tgt_lang, data_dir=cfg.data_dir, download=download)
    src, tgt = _split_files(cfg, split)
    if src is None:
        return []
    if tgt is None:
        return read_tsv(src)
    return read_parallel(src, tgt)


def _split_files(cfg: TrainConfig, split: str) -> tuple[str, str | None]:
    """A ``files`` dataset's source and target files of ``split`` (target None: one TSV)."""
    return (cfg.train_src, cfg.train_tgt) if split == "train" else (cfg.valid_src, cfg.valid_tgt)


def _pair_files(cfg: TrainConfig, split: str) -> str:
    """The files of a split, or the dataset's name, as messages name them."""
    if cfg.dataset != "files":
        return cfg.dataset
    src, tgt = _split_files(cfg, split)
    return src if tgt is None else f"{src} and {tgt}"


def _no_pairs(cfg: TrainConfig, split: str, n_empty: int) -> str:
    """The one-line error for a split without a sentence pair, naming its file(s)."""
    name = "training" if split == "train" else "validation"
    if cfg.dataset != "files":
        return f"{cfg.dataset}: no {name} pairs left after skipping {n_empty} with an empty side"
    src, tgt = _split_files(cfg, split)
    if tgt is None:  # one TSV file
        why = f"each of its {n_empty} lines is empty on one side or both" if n_empty else "the file is empty"
        return f"{src}: no {name} pairs ({why}); give a file of sentence pairs"
    why = f"each of their {n_empty} lines is empty on one side or both" if n_empty else "both files are empty"
    return f"{src} and {tgt}: no {name} pairs ({why}); give files of sentence pairs"


def held_out_size(valid_size: float, n_pairs: int) -> int:
    """valid_size as a number of pairs: itself when >= 1, else that fraction of ``n_pairs``
    rounded up (so that a small corpus still validates), at most 1,000."""
    if valid_size >= 1:
        return int(valid_size)
    return min(1000, math.ceil(valid_size * n_pairs))


def _pairs(cfg: TrainConfig, log, download: bool = True) -> tuple[list[tuple[str, str]], list[tuple[str, str]], int]:
    """(training pairs, validation pairs, empty pairs skipped). dataset files without a
    validation file: valid_size training pairs, drawn with seed, validate instead."""
    train_pairs, n_empty = clean_pairs(_read_pairs(cfg, "train", download))
    if not train_pairs:
        raise UserError(_no_pairs(cfg, "train", n_empty))
    valid, n_empty_valid = clean_pairs(_read_pairs(cfg, "valid", download))
    if cfg.dataset == "files" and cfg.valid_src and not valid:  # else the run would train without validation
        raise UserError(_no_pairs(cfg, "valid", n_empty_valid) + " (or leave valid_src out: valid_size then holds "
                                                                  "out training pairs)")
    n_held = held_out_size(cfg.valid_size, len(train_pairs)) if cfg.dataset == "files" and not cfg.valid_src else 0
    if n_held:
        n_all = len(train_pairs)
        train_pairs, valid = hold_out(train_pairs, n_held, cfg.seed)
        log(f"held out {n_held:,} of {n_all:,} training pairs for validation (valid_size {cfg.valid_size:g}, "
            f"seed {cfg.seed})")
    if cfg.train_limit:
        train_pairs = train_pairs[: cfg.train_limit]
    if cfg.valid_limit:
        valid = valid[: cfg.valid_limit]
    return train_pairs, valid, n_empty


def _subwords(cfg: TrainConfig, run_dir: Path, train_pairs: list[tuple[str, str]], subwords_from: Path | None,
              log) -> Subwords:
    """The run's subword model: the one in run_dir, else a copy of ``subwords_from``, else
    one learned on the training pairs (saved in run_dir)."""
    sw_path = Path(run_dir) / SUBWORDS
    if sw_path.is_file():
        if subwords_from is not None and file_sha256(sw_path) != file_sha256(subwords_from):
            raise UserError(f"{sw_path} is not the subword model {subwords_from} the config reuses; "
                            "use another --out directory")
        subwords = Subwords.load(sw_path)
    elif subwords_from is not None:
        atomic_write(sw_path, lambda tmp: shutil.copyfile(subwords_from, tmp))
        subwords = Subwords.load(sw_path)
        log(f"reusing the subword model {subwords_from} ({subwords.vocab_size} subwords) -> {sw_path}")
    else:
        texts = [s for s, _ in train_pairs] + [t for _, t in train_pairs]
        subwords = train_subwords(texts, Path(run_dir) / "subwords", vocab_size=cfg.vocab_size,
                                  lowercase=cfg.lowercase)
        cased = ", lower-casing" if cfg.lowercase else ""
        log(f"learned a joint BPE vocabulary of {subwords.vocab_size} subwords{cased} -> {sw_path}")
    if subwords.lowercases != cfg.lowercase:
        raise UserError(f"{sw_path}: this subword model {'lower-cases' if subwords.lowercases else 'keeps case'}, "
                        f"but the config says lowercase: {str(cfg.lowercase).lower()}; "
                        "use another --out directory or change the option")
    return subwords


def prepare_data(cfg: TrainConfig, run_dir: Path, max_len: int | None = None,
                 log=print, subwords_from: Path | None = None, download: bool = True) -> PreparedData | PreparedText:
    """Everything the training loop needs from the corpus. The subword model is learned
    once, on the training text (or copied from ``subwords_from``), and saved in the run
    directory; later runs reuse it. ``download=False``: a dataset missing from the data
    folder is a UserError, not fetched."""
    if cfg.is_language_model:
        return prepare_text(cfg, run_dir, cfg.context or max_len, log, download)
    train_pairs, valid, n_empty = _pairs(cfg, log, download)
    subwords = _subwords(cfg, run_dir, train_pairs, subwords_from, log)
    if cfg.lowercase:  # validation BLEU compares lower-case output with lower-case references
        valid = [(s, t.lower()) for s, t in valid]
    encoded = [(subwords.encode(s), subwords.encode(t)) for s, t in train_pairs]
    n_too_long = 0
    if max_len is not None:
        encoded, n_too_long = filter_long(encoded, max_len)
        if not encoded:  # else the batching reports an empty epoch, which names max_tokens
            raise UserError(f"{_pair_files(cfg, 'train')}: every one of the {n_too_long} training pairs is too long "
                            f"for the model's {max_len} positions (model.max_len; subwords plus BOS and EOS); "
                            "raise model.max_len or split the long lines")
    log(f"training pairs: {len(encoded)} (skipped {n_empty} empty, {n_too_long} longer than {max_len} tokens); "
        f"validation pairs: {len(valid)}")
    return PreparedData(subwords, encoded, valid, n_empty, n_too_long)


def prepare_run(cfg: TrainConfig, run_dir: Path, max_len: int | None, log=print,
                subwords_from: Path | None = None,
                tokenizer_from: dict[str, Path] | None = None) -> PreparedData | PreparedText:
    """Rank 0 before training: tidy the leftovers of a crash, read the corpus, learn or
    reload the subwords (or copy in ``tokenizer_from``, a fine-tuned language model's source
    tokenizer files), write config.yaml. The subwords are learned in a private folder
    and moved in complete (the model last: its presence means complete), so a crash while
    sentencepiece writes never leaves a truncated subwords.model to be reused."""
    remove_stale_files(run_dir)
    if tokenizer_from:
        copy_tokenizer(tokenizer_from, run_dir, log)
    if tokenizer_file(cfg, run_dir).is_file():
        data = prepare_data(cfg, run_dir, max_len, log, subwords_from)
    else:
        try:
            staging = Path(tempfile.mkdtemp(prefix=".prepare.", dir=run_dir))
        except OSError as e:
            raise UserError(f"{run_dir}: cannot write ({e.strerror or e})") from None
        try:
            data = prepare_data(cfg, staging, max_len,
                                lambda *a: log(" ".join(map(str, a)).replace(str(staging), str(run_dir))),
                                subwords_from)
            for name in (SUBWORDS_VOCAB, SUBWORDS, CHARS):
                if (staging / name).is_file():
                    atomic_write(run_dir / name, lambda tmp, f=staging / name: shutil.copyfile(f, tmp))
            if isinstance(data, PreparedText):
                data.tokenizer.path = tokenizer_file(cfg, run_dir)
            else:
                data.subwords.path = run_dir / SUBWORDS
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    write_text_atomic(run_dir / CONFIG, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return data
