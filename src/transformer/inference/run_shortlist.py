"""A run's vocabulary shortlist (:mod:`transformer.decode.shortlist`): ``shortlist.safetensors``
in the run folder, built once, on first use, from the parallel corpus the run trained on (its
config.yaml names it), with the run's own subword model.

An imported model (Marian, Hugging Face) has no training corpus here: its shortlist is built
from a parallel text the user gives (``--shortlist-from SRC TGT``), or ``--shortlist`` is
refused with one line naming that option. Reading the file never follows a symbolic link; writing replaces the file
atomically (a link there is replaced, never written through).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..data import clean_pairs, load_multi30k, read_parallel, read_tsv
from ..decode.shortlist import Shortlist, build_shortlist, load_shortlist, save_shortlist
from ..errors import UserError
from ..run.layout import IMPORT_RECORD, SHORTLIST, read_run_config, run_root


def run_shortlist(path: str | Path, subwords, cfg, log=None, pairs: list[tuple[str, str]] | None = None) -> Shortlist:
    """The shortlist of the run ``path`` belongs to (its folder's ``shortlist.safetensors``),
    built from its training corpus and saved there first when it has none; built from
    ``pairs`` (source, target sentences: ``--shortlist-from``) and saved, replacing it, when
    they are given. ``log(line)`` is told when one is built (default: a line on stderr)."""
    root = run_root(path)
    if root is None:
        raise UserError(f"{path}: --shortlist needs a run folder (its {SHORTLIST}, or the training corpus its "
                        "config.yaml names); give the run directory, or decode without --shortlist")
    file = root / SHORTLIST
    if pairs is None and (file.exists() or file.is_symlink()):
        return load_shortlist(file, cfg.vocab_size, cfg.target_vocab_size)
    kind = "training" if pairs is None else "given"
    pairs = training_pairs(root) if pairs is None else pairs
    shortlist = build_run_shortlist(root, pairs, subwords, cfg)
    (log or _stderr)(f"built the vocabulary shortlist of {root} from {len(pairs):,} {kind} pairs -> {file}")
    return shortlist


def build_run_shortlist(root: str | Path, pairs: list[tuple[str, str]], subwords, cfg) -> Shortlist:
    """A shortlist from sentence ``pairs`` (source, target text), encoded with ``subwords``
    (the target side with its target tokenizer where it has one), saved as the run's."""
    encode_target = getattr(subwords, "encode_target", subwords.encode)
    encoded = ((subwords.encode(s), encode_target(t)) for s, t in pairs)
    shared = not hasattr(subwords, "encode_target") and cfg.vocab_size == cfg.target_vocab_size
    shortlist = build_shortlist(encoded, cfg.vocab_size, cfg.target_vocab_size, cfg.eos_id, shared)
    save_shortlist(shortlist, Path(root) / SHORTLIST)
    return shortlist


def training_pairs(root: Path) -> list[tuple[str, str]]:
    """The sentence pairs the run at ``root`` trained on (its config.yaml's dataset; nothing is
    downloaded); a one-line UserError when it has none here."""
    config = read_run_config(root)
    dataset = config.get("dataset")
    if (root / IMPORT_RECORD).is_file() or dataset not in ("multi30k", "files"):
        raise UserError(f"{root}: --shortlist needs the parallel corpus the model was trained on, and this run "
                        "(imported, or not a translation run trained here) names none; build it from a "
                        "parallel text with --shortlist-from SRC TGT, or decode without --shortlist")
    if dataset == "multi30k":
        pairs = load_multi30k("train", config.get("src_lang", "en"), config.get("tgt_lang", "de"),
                              data_dir=config.get("data_dir"), download=False)
    elif config.get("train_tgt"):
        pairs = read_parallel(config["train_src"], config["train_tgt"])
    else:
        pairs = read_tsv(config["train_src"])
    pairs, _ = clean_pairs(pairs)
    limit = config.get("train_limit") or 0
    return pairs[:limit] if isinstance(limit, int) and limit > 0 else pairs


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
