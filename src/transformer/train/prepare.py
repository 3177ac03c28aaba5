"""Training data for a run: read the corpus, learn (or reload) the subwords, encode, filter;
and the run directory's own files before the first update (subwords, config.yaml)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import shutil
import tempfile

import yaml

from ..data import Subwords, clean_pairs, filter_long, load_multi30k, read_parallel, read_tsv, train_subwords
from ..errors import UserError
from ..run.files import atomic_write, write_text_atomic
from ..run.layout import CONFIG, SUBWORDS, remove_stale_files
from .config import TrainConfig


@dataclass
class PreparedData:
    subwords: Subwords
    train: list[tuple[list[int], list[int]]]  # encoded (src, tgt) pairs, no BOS/EOS
    valid: list[tuple[str, str]]  # raw text pairs, for loss and BLEU
    n_empty: int  # training pairs skipped because a side was empty
    n_too_long: int  # training pairs longer than the model's max_len


def _read_pairs(cfg: TrainConfig, split: str) -> list[tuple[str, str]]:
    if cfg.dataset == "multi30k":
        name = {"train": "train", "valid": "val"}[split]
        return load_multi30k(name, cfg.src_lang, cfg.tgt_lang, data_dir=cfg.data_dir)
    src, tgt = (cfg.train_src, cfg.train_tgt) if split == "train" else (cfg.valid_src, cfg.valid_tgt)
    if src is None:
        return []
    if tgt is None:
        return read_tsv(src)
    return read_parallel(src, tgt)


def prepare_data(cfg: TrainConfig, run_dir: Path, max_len: int | None = None, log=print) -> PreparedData:
    """Everything the training loop needs from the corpus. The subword model is learned
    once, on the training text, and saved in the run directory; later runs reuse it."""
    train_pairs, n_empty = clean_pairs(_read_pairs(cfg, "train"))
    if cfg.train_limit:
        train_pairs = train_pairs[: cfg.train_limit]
    if not train_pairs:
        raise UserError("no training pairs left after skipping empty lines")
    valid, _ = clean_pairs(_read_pairs(cfg, "valid"))
    if cfg.valid_limit:
        valid = valid[: cfg.valid_limit]
    sw_path = Path(run_dir) / SUBWORDS
    if sw_path.is_file():
        subwords = Subwords.load(sw_path)
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
    if cfg.lowercase:  # validation BLEU compares lower-case output with lower-case references
        valid = [(s, t.lower()) for s, t in valid]
    encoded = [(subwords.encode(s), subwords.encode(t)) for s, t in train_pairs]
    n_too_long = 0
    if max_len is not None:
        encoded, n_too_long = filter_long(encoded, max_len)
    log(f"training pairs: {len(encoded)} (skipped {n_empty} empty, {n_too_long} longer than {max_len} tokens); "
        f"validation pairs: {len(valid)}")
    return PreparedData(subwords, encoded, valid, n_empty, n_too_long)


def prepare_run(cfg: TrainConfig, run_dir: Path, max_len: int | None, log=print) -> PreparedData:
    """Rank 0 before training: tidy the leftovers of a crash, read the corpus, learn or
    reload the subwords, write config.yaml. The subwords are learned in a private folder
    and moved in complete (the model last: its presence means complete), so a crash while
    sentencepiece writes never leaves a truncated subwords.model to be reused."""
    remove_stale_files(run_dir)
    if (run_dir / SUBWORDS).is_file():
        data = prepare_data(cfg, run_dir, max_len, log)
    else:
        try:
            staging = Path(tempfile.mkdtemp(prefix=".prepare.", dir=run_dir))
        except OSError as e:
            raise UserError(f"{run_dir}: cannot write ({e.strerror or e})") from None
        try:
            data = prepare_data(cfg, staging, max_len,
                                lambda *a: log(" ".join(map(str, a)).replace(str(staging), str(run_dir))))
            for name in ("subwords.vocab", SUBWORDS):
                if (staging / name).is_file():
                    atomic_write(run_dir / name, lambda tmp, f=staging / name: shutil.copyfile(f, tmp))
            data.subwords.path = run_dir / SUBWORDS
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    write_text_atomic(run_dir / CONFIG, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return data
