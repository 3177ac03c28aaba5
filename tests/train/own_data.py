"""Helpers for the tests of one's own data, fine-tuning and reuse (the fixtures are in this
folder's conftest.py): the toy recipe's overrides and small file writers."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOY = ["vocab_size=120", "model.preset=toy", "max_tokens=256", "lr_schedule=inverse_sqrt", "peak_lr=0.002",
       "warmup=8", "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=1000"]


def file_overrides(corpus: dict[str, Path], valid: bool = True) -> list[str]:
    """The toy recipe on the corpus, with or without its validation files."""
    keys = ("train_src", "train_tgt", "valid_src", "valid_tgt") if valid else ("train_src", "train_tgt")
    return ["dataset=files", *(f"{k}={corpus[k]}" for k in keys), *TOY]


def pairs_of(corpus: dict[str, Path], split: str) -> list[tuple[str, str]]:
    src = corpus[f"{split}_src"].read_text(encoding="utf-8").splitlines()
    return list(zip(src, corpus[f"{split}_tgt"].read_text(encoding="utf-8").splitlines()))


def write_tsv(path: Path, pairs) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def quiet(*_) -> None:
    return None
