"""Fixtures for the property-based tests: a tiny trained run (20 steps of a toy model: the
outputs need not be good, only produced) and its sentencepiece model. The in-process CLI
runner and the hypothesis settings are in props_helpers.py, the strategies in
props_strategies.py."""
from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path

import pytest
import torch
from props_helpers import run_cli

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

SRC_WORDS = ("red blue green small big dog cat bird man woman child runs sits eats sees plays "
             "with near under the a ball tree house car water park street").split()
TGT_OF = {w: "x" + w[::-1] for w in SRC_WORDS}
# A little of everything a real corpus holds, so the subword model knows these characters.
EXTRA = ["Grüße aus Köln, sagte Ängstliche Straße.", "«Café» — naïve – “quotes” ‘too’…", "1,5 % von 30 € (ca. 2 $)!"]


def write_corpus(folder: Path, n_train: int = 300, n_valid: int = 10, seed: int = 0) -> dict[str, Path]:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        sents = [[rng.choice(SRC_WORDS) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        src = [" ".join(s) for s in sents] + (EXTRA if split == "train" else [])
        tgt = [" ".join(TGT_OF[w] for w in s) for s in sents] + (EXTRA if split == "train" else [])
        for side, text in (("src", src), ("tgt", tgt)):
            path = folder / f"{split}.{side}"
            path.write_text("".join(t + "\n" for t in text), encoding="utf-8")
            paths[f"{split}_{side}"] = path
    return paths


def _shared(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A run directory (toy model, 20 steps) shared by the xdist workers."""
    from transformer.train.config import load_config
    from transformer.train.trainer import Trainer

    base = _shared(tmp_path_factory) / "props-run"
    with open(str(base) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "done").exists():
            corpus = write_corpus(base / "corpus")
            cfg = load_config(None, [
                "dataset=files", *(f"{k}={v}" for k, v in corpus.items()), "vocab_size=120",
                "model.preset=toy", "max_tokens=512", "max_steps=20", "warmup=10", "lr_schedule=inverse_sqrt",
                "peak_lr=0.005", "eval_every=1000", "eval_bleu=false", "progress=false", "threads=1",
                "precision=fp32",
            ])
            Trainer(cfg, base / "run", log=lambda *a: None).train()
            (base / "done").write_text("ok")
    return base / "run"


@pytest.fixture(scope="session")
def subwords(trained_run):
    from transformer.data import Subwords

    return Subwords.load(trained_run / "subwords.model")


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    """A session folder for the files hypothesis examples write (function-scoped tmp_path
    would be shared by all examples of one test anyway)."""
    return tmp_path_factory.mktemp("props")


@pytest.fixture(scope="session")
def canary(trained_run) -> str:
    """The translation of test_props_cli.CANARY on its own (greedy)."""
    r = run_cli("translate", "--model", trained_run, "--beam", "1", "--max-tokens", "1",
                stdin=b"red dog runs with the big cat\n")
    assert r.code == 0, r.err
    return r.out.rstrip("\n")
