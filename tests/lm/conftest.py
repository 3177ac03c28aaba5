"""Fixtures for the language-model tests: a tiny text written in tmp_path and a toy
decoder-only config on it (one layer, 32 wide, context 16), so that a training step takes
a few milliseconds on one core."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from transformer.train.train_config import TrainConfig, load_config

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from lm_text import make_text  # noqa: E402


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "tiny.txt"
    path.write_text(make_text(), encoding="utf-8")
    return path


def lm_overrides(*paths: Path) -> list[str]:
    return [
        "dataset=text", f"text_files=[{', '.join(str(p) for p in paths)}]", "tokenizer=chars",
        "model.preset=nanogpt-char", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1",
        "model.max_len=16", "batch_size=4", "optimizer=adamw", "betas=[0.9, 0.99]", "weight_decay=0.1",
        "lr_schedule=cosine", "peak_lr=0.01", "min_lr=0.001", "warmup=2", "clip_norm=1.0", "precision=fp32",
        "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=1000",
    ]


@pytest.fixture
def lm_cfg(text_file) -> Callable[..., TrainConfig]:
    """``lm_cfg("max_steps=4", ...)`` -> a toy language-model TrainConfig on ``text_file``."""
    def make(*overrides: str) -> TrainConfig:
        return load_config(None, lm_overrides(text_file) + list(overrides))

    return make


@pytest.fixture
def config_file(tmp_path) -> Callable[..., Path]:
    """``config_file(*overrides)`` -> a YAML file of the toy config (for the CLI)."""
    def make(*overrides: str, text: Path | None = None) -> Path:
        from transformer.train.train_config import apply_overrides

        data = apply_overrides({}, lm_overrides(text or tmp_path / "tiny.txt") + list(overrides))
        path = tmp_path / "lm.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return make


@pytest.fixture(scope="session")
def trained_lm(tmp_path_factory) -> Path:
    """A toy language-model run, trained for 60 updates (a few seconds), shared by a session."""
    from transformer.train.trainer import Trainer

    root = tmp_path_factory.mktemp("trained-lm")
    text = root / "tiny.txt"
    text.write_text(make_text(), encoding="utf-8")
    run = root / "run"
    cfg = load_config(None, lm_overrides(text) + ["max_steps=60", "eval_every=60", "save_every=60"])
    Trainer(cfg, run, log=lambda *a: None).train()
    return run


@pytest.fixture(scope="session")
def trained_llama(tmp_path_factory) -> Path:
    """The toy run with the Llama-style block (RMSNorm, SwiGLU's three matrices, rotary
    positions, no biases, an untied head), 2 layers, trained for 20 updates."""
    from transformer.train.trainer import Trainer

    root = tmp_path_factory.mktemp("trained-llama")
    text = root / "tiny.txt"
    text.write_text(make_text(), encoding="utf-8")
    run = root / "run"
    cfg = load_config(None, lm_overrides(text) + ["model.preset=llama-char", "model.n_layers=2", "max_steps=20",
                                                  "eval_every=20", "save_every=20"])
    Trainer(cfg, run, log=lambda *a: None).train()
    return run
