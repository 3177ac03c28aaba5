"""Fixtures for the data-parallel tests: TINY configs on the synthetic corpus (the ``corpus``
fixture of tests/conftest.py); the ``torchrun`` helpers are in dist_helpers.py.

Every run is a toy model in fp32 with dropout 0 for a handful of steps; a launch costs
~5-10 s, mostly interpreter and torch start-up in three processes.
"""
from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def overrides(corpus) -> list[str]:
    """A toy model, fp32, no dropout: one process with accum_steps=2 and two with
    accum_steps=1 see the same 2 x 256-token micro-batches per update (21 batches an epoch,
    so 8 updates stay inside the first epoch)."""
    return [
        "dataset=files",
        f"train_src={corpus['train_src']}", f"train_tgt={corpus['train_tgt']}",
        f"valid_src={corpus['valid_src']}", f"valid_tgt={corpus['valid_tgt']}",
        "vocab_size=120", "model.preset=toy", "model.dropout=0.0", "precision=fp32", "max_tokens=256",
        "lr_schedule=inverse_sqrt", "peak_lr=0.002", "warmup=8", "eval_bleu=false",
        "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=2", "keep_last=10",
    ]
