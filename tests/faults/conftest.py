"""Fixtures for the fault tests: TINY configs (``make_cfg``) on the synthetic corpus (the
``corpus`` fixture of tests/conftest.py) and a YAML config for real ``transformer train``
processes (the run-directory check is in fault_helpers.py)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from transformer.train.train_config import TrainConfig, apply_overrides, load_config

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny_corpus import toy_overrides  # noqa: E402


def base_overrides(corpus: dict[str, Path]) -> list[str]:
    """The toy model (tiny_corpus.toy_overrides), in fp32."""
    return toy_overrides(corpus) + ["precision=fp32"]


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
