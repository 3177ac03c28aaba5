"""Fixtures for the export tests: one small trained run directory per session (built once,
by the real ``transformer train`` command, shared by the xdist workers), tiny random models,
and a helper that runs ``transformer.cli.main`` in-process.

The run is a toy model trained for 300 steps on a synthetic word-for-word "language pair"
(a few seconds on one core): its outputs depend on the input and end with EOS, so searches
can be compared token for token. (The same pattern as tests/cli/conftest.py, kept separate
so that the two folders do not depend on each other.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import train_tiny_run  # noqa: E402


@dataclass
class Trained:
    run: Path  # the run directory (best.safetensors, subwords.model, checkpoints/)
    corpus: dict[str, Path]

    def sources(self, n: int = 20) -> list[str]:
        """The first ``n`` validation source sentences."""
        return self.corpus["valid_src"].read_text(encoding="utf-8").splitlines()[:n]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Trained:
    run, corpus, _ = train_tiny_run(tmp_path_factory, "export")
    return Trained(run, corpus)




@pytest.fixture
def one_line_error(one_line_error):
    """The shared check with the command fixed: ``one_line_error(result, *mentions)``."""
    return lambda r, *mentions: one_line_error(r, "export", *mentions)
