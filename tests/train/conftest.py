"""Fixtures for the tests of one's own data, fine-tuning and reuse: the synthetic word-for-word
corpus (tests/tiny_corpus.py), toy training configs on it, and one small trained run to
start from. Every run here is the toy model for a few updates: seconds on one core."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from transformer.train.train_config import TrainConfig, load_config
from transformer.train.trainer import Trainer

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from own_data import file_overrides  # noqa: E402
from tiny_corpus import write_corpus  # noqa: E402


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """train.src/tgt (160 pairs) and valid.src/tgt (12 pairs)."""
    return write_corpus(tmp_path_factory.mktemp("own-corpus"), n_train=160, n_valid=12)


@pytest.fixture(scope="session")
def make_cfg(corpus) -> Callable[..., TrainConfig]:
    """``make_cfg("max_steps=2", ...)``: the toy config on the corpus (with its validation files)."""
    return lambda *overrides: load_config(None, file_overrides(corpus) + list(overrides))


@pytest.fixture(scope="session")
def write_config(corpus) -> Callable[..., Path]:
    """``write_config(path, **keys)``: a YAML config of the toy recipe on the corpus, plus ``keys``
    (a key set to None is left out), for the command line."""
    def write(path: Path, **keys) -> Path:
        data = load_config(None, file_overrides(corpus)).to_dict()
        data = {k: v for k, v in {**data, **keys}.items() if v is not None}
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session")
def source_run(tmp_path_factory, make_cfg) -> Path:
    """A toy run of 4 updates (checkpoints at 2 and 4, best.safetensors): what fine-tuning
    and subwords_from start from. Do not change it; copy it."""
    run = tmp_path_factory.mktemp("source") / "run"
    Trainer(make_cfg("max_steps=4", "save_every=2", "model.dropout=0.1"), run, log=lambda *a: None).train()
    return run
