"""Fixtures for the training-run tests: TINY training configs built with
``load_config(None, overrides)`` on the synthetic parallel corpus (the ``corpus`` fixture of
tests/conftest.py, so that these tests need no downloaded data).

Every training here is a toy model on 400 short sentence pairs for a handful of steps; the
whole directory must run in well under a minute on two shared cores.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
import torch

from transformer.train.train_config import TrainConfig, load_config

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import read_metrics  # noqa: E402
from tiny_corpus import toy_overrides as base_overrides  # noqa: E402


@pytest.fixture(scope="session")
def make_cfg(corpus) -> Callable[..., TrainConfig]:
    """``make_cfg("max_steps=4", ...)`` -> TrainConfig on the synthetic corpus."""
    def make(*overrides: str) -> TrainConfig:
        return load_config(None, base_overrides(corpus) + list(overrides))

    return make


@pytest.fixture(scope="session")
def run_overrides(corpus) -> list[str]:
    return base_overrides(corpus)


@pytest.fixture
def metrics() -> Callable[[Path], list[dict]]:
    """``metrics(run_dir)`` -> the records of RUN_DIR/metrics.jsonl."""
    return read_metrics
