"""Fixtures for the fault tests: a tiny synthetic corpus, TINY configs (``make_cfg``) and a
YAML config for real ``transformer train`` processes (the run-directory check is in
fault_helpers.py)."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from transformer.train.config import TrainConfig, apply_overrides, load_config

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import write_corpus  # noqa: E402


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    with open(root / "faults-corpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return write_corpus(root / "faults-corpus")


def base_overrides(corpus: dict[str, Path]) -> list[str]:
    return [
        "dataset=files",
        f"train_src={corpus['train_src']}", f"train_tgt={corpus['train_tgt']}",
        f"valid_src={corpus['valid_src']}", f"valid_tgt={corpus['valid_tgt']}",
        "vocab_size=120", "model.preset=toy", "max_tokens=256", "precision=fp32",
        "lr_schedule=inverse_sqrt", "peak_lr=0.002", "warmup=8",
        "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=1000",
    ]


@pytest.fixture(scope="session")
def make_cfg(corpus) -> Callable[..., TrainConfig]:
    """``make_cfg("max_steps=4", ...)`` -> TrainConfig on the synthetic corpus."""
    return lambda *overrides: load_config(None, base_overrides(corpus) + list(overrides))


@pytest.fixture(scope="session")
def write_config(corpus) -> Callable[..., Path]:
    """``write_config(path, "max_steps=4", ...)`` -> a YAML file for ``transformer train --config``."""
    def write(path: Path, *overrides: str) -> Path:
        path.write_text(yaml.safe_dump(apply_overrides({}, base_overrides(corpus) + list(overrides))))
        return path

    return write


FOUR_STEPS = ("max_steps=4", "save_every=2", "keep_last=5")


@pytest.fixture(scope="session")
def four_steps(tmp_path_factory, make_cfg) -> Path:
    """A finished run with checkpoints at steps 2 and 4 (``FOUR_STEPS``); copy it before damaging it."""
    from transformer.train.trainer import Trainer

    run = tmp_path_factory.mktemp("four-steps") / "run"
    Trainer(make_cfg(*FOUR_STEPS), run, log=lambda *a: None).train()
    return run


@pytest.fixture
def four_steps_copy(four_steps, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(four_steps, dst)
    return dst
