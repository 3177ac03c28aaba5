"""Training data for a run: read the corpus, learn (or reload) the subwords, encode, filter."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data import (Subwords, clean_pairs, example_lengths, filter_long, fits, load_multi30k, read_parallel,
                    read_tsv, train_subwords)
from ..data.subword_dropout import SubwordDropout
from ..errors import UserError
from .config import TrainConfig

SUBWORDS = "subwords.model"


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


class EpochExamples:
    """The training examples of each epoch, for the sampler (``lengths``) and the batches.

    With ``subword_dropout == 0`` every epoch has the fixed encoding ``data.train``. Otherwise
    each epoch re-segments the training text with BPE-dropout (:class:`SubwordDropout`),
    seeded by ``(seed, epoch)``, so a resumed or data-parallel run sees the same pieces. An
    example whose sampled pieces no longer fit ``max_len`` keeps its fixed encoding (which
    fits: longer ones were filtered out), so the example indices never change.
    """

    def __init__(self, data: PreparedData, subword_dropout: float, seed: int, max_len: int | None):
        self.data, self.max_len = data, max_len
        self.dropout: SubwordDropout | None = None
        if subword_dropout:
            self.dropout = SubwordDropout(data.subwords, [s for s, _ in data.train] + [t for _, t in data.train],
                                          subword_dropout, seed)
        self._cache: dict[int, list[tuple[list[int], list[int]]]] = {}

    def __call__(self, epoch: int) -> list[tuple[list[int], list[int]]]:
        if self.dropout is None:
            return self.data.train
        if epoch not in self._cache:
            if len(self._cache) >= 2:  # the current epoch and the next one are enough
                del self._cache[min(self._cache)]
            self._cache[epoch] = self._sample(epoch)
        return self._cache[epoch]

    def lengths(self, epoch: int) -> list[tuple[int, int]]:
        return example_lengths(self(epoch))

    def _sample(self, epoch: int) -> list[tuple[list[int], list[int]]]:
        n = len(self.data.train)
        ids = self.dropout.epoch(epoch)
        sampled = list(zip(ids[:n], ids[n:]))
        if self.max_len is None:
            return sampled
        keep = fits(sampled, self.max_len)
        return [ex if k else fixed for ex, fixed, k in zip(sampled, self.data.train, keep)]
