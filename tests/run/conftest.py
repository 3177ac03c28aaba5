"""Fixtures for the training-run tests: a tiny synthetic parallel corpus (so that these tests
need no downloaded data) and TINY training configs built with ``load_config(None, overrides)``.

Every training here is a toy model on 400 short sentence pairs for a handful of steps; the
whole directory must run in well under a minute on two shared cores.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Callable

import pytest
import torch

from transformer.train.config import TrainConfig, load_config

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import write_corpus  # noqa: E402


def shared_dir(tmp_path_factory) -> Path:
    """A folder shared by all xdist workers of this session."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    folder = shared_dir(tmp_path_factory) / "run-corpus"
    with open(shared_dir(tmp_path_factory) / "run-corpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return write_corpus(folder)


def base_overrides(corpus: dict[str, Path]) -> list[str]:
    """A toy model on the synthetic corpus; a few milliseconds per step on one core."""
    return [
        "dataset=files",
        f"train_src={corpus['train_src']}", f"train_tgt={corpus['train_tgt']}",
        f"valid_src={corpus['valid_src']}", f"valid_tgt={corpus['valid_tgt']}",
        "vocab_size=120", "model.preset=toy", "max_tokens=256",
        "lr_schedule=inverse_sqrt", "peak_lr=0.002", "warmup=8",
        "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=1000",
    ]


@pytest.fixture(scope="session")
def make_cfg(corpus) -> Callable[..., TrainConfig]:
    """``make_cfg("max_steps=4", ...)`` -> TrainConfig on the synthetic corpus."""
    def make(*overrides: str) -> TrainConfig:
        return load_config(None, base_overrides(corpus) + list(overrides))

    return make


@pytest.fixture(scope="session")
def run_overrides(corpus) -> list[str]:
    return base_overrides(corpus)


def read_metrics(run_dir: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


@pytest.fixture
def metrics() -> Callable[[Path], list[dict]]:
    """``metrics(run_dir)`` -> the records of RUN_DIR/metrics.jsonl."""
    return read_metrics
