"""Fixtures for the command-line tests: one small trained run directory per session (built
once, by the real ``transformer train`` command, and shared by the xdist workers), plus a
helper that runs ``transformer.cli.main`` in-process and captures its output.

The run is a toy model trained for 300 steps (a few seconds on one core) on a synthetic
word-for-word "language pair", enough for its translations to depend on the input.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import TGT_OF, TRANSFORMER, process_env, train_tiny_run  # noqa: E402


@pytest.fixture(scope="session")
def target_words() -> set[str]:
    """Every word of the synthetic target language."""
    return set(TGT_OF.values())


@dataclass
class Trained:
    run: Path  # the run directory (3 checkpoints: 100, 200, 300; best.safetensors)
    corpus: dict[str, Path]
    config: Path


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Trained:
    run, corpus, config = train_tiny_run(tmp_path_factory, "cli", eval_every=100, save_every=100, keep_last=3,
                                         log_every=50)
    return Trained(run, corpus, config)


@pytest.fixture
def real_cli():
    """``real_cli(*argv, input=None, env=None)`` -> CompletedProcess of the console script
    (a real process: interpreter start-up, signals, stdin/stdout encodings)."""
    def run(*argv, input=None, env=None, timeout=120):
        return subprocess.run([TRANSFORMER, *map(str, argv)], input=input, capture_output=True,
                              text=not isinstance(input, bytes), env={**process_env(), **(env or {})},
                              timeout=timeout)

    return run


