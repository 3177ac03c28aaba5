"""Fixtures for the property-based tests: a tiny trained run (20 steps of a toy model: the
outputs need not be good, only produced) and its sentencepiece model. The in-process CLI
runner and the hypothesis settings are in props_helpers.py, the strategies in
props_strategies.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from props_helpers import run_cli

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import build_once, write_corpus  # noqa: E402

# A little of everything a real corpus holds, so the subword model knows these characters.
EXTRA = ["Grüße aus Köln, sagte Ängstliche Straße.", "«Café» — naïve – “quotes” ‘too’…", "1,5 % von 30 € (ca. 2 $)!"]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """A run directory (toy model, 20 steps) shared by the xdist workers."""
    from transformer.train.train_config import load_config
    from transformer.train.trainer import Trainer

    def train(base: Path) -> None:
        corpus = write_corpus(base / "corpus", n_train=300, n_valid=10, extra=EXTRA)
        cfg = load_config(None, [
            "dataset=files", *(f"{k}={v}" for k, v in corpus.items()), "vocab_size=120",
            "model.preset=toy", "max_tokens=512", "max_steps=20", "warmup=10", "lr_schedule=inverse_sqrt",
            "peak_lr=0.005", "eval_every=1000", "eval_bleu=false", "progress=false", "threads=1",
            "precision=fp32",
        ])
        Trainer(cfg, base / "run", log=lambda *a: None).train()

    return build_once(tmp_path_factory, "props-run", train) / "run"


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
