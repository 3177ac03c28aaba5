"""Tiny Shakespeare from the registry (local copy first, else the published file checked
against its SHA-256) and the configs/shakespeare-char.yaml recipe: nanoGPT's CPU recipe."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from transformer.data.registry import TINY_SHAKESPEARE, tinyshakespeare_path
from transformer.errors import UserError
from transformer.train.train_config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "shakespeare-char.yaml"


def test_a_local_copy_is_used_as_it_is(tmp_path):
    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    path.write_text("First Citizen:\n")
    assert tinyshakespeare_path(tmp_path, fetch=lambda url: pytest.fail("downloaded")) == path


def test_a_download_is_checked_before_it_is_kept(tmp_path):
    with pytest.raises(UserError, match="checksum mismatch for https://raw.githubusercontent.com/karpathy"):
        tinyshakespeare_path(tmp_path, fetch=lambda url: b"not shakespeare")
    assert not (tmp_path / "tinyshakespeare" / "input.txt").exists()
    with pytest.raises(UserError, match="downloading is off"):
        tinyshakespeare_path(tmp_path, download=False)


def test_a_verified_download_is_kept(tmp_path, monkeypatch):
    import dataclasses

    import transformer.data.registry as registry

    data = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"
    monkeypatch.setattr(registry, "TINY_SHAKESPEARE",
                        dataclasses.replace(TINY_SHAKESPEARE, sha256=hashlib.sha256(data).hexdigest()))
    assert tinyshakespeare_path(tmp_path, fetch=lambda url: data).read_bytes() == data


def test_the_shared_copy_is_the_published_file():
    try:
        path = tinyshakespeare_path(download=False)
    except UserError:
        pytest.skip("no Tiny Shakespeare in the data folder ($TRANSFORMER_DATA)")
    data = path.read_bytes()
    assert len(data) == 1_115_394 and hashlib.sha256(data).hexdigest() == TINY_SHAKESPEARE.sha256


def test_the_recipe_is_nanogpts_cpu_recipe():
    cfg = load_config(CONFIG)
    model = cfg.model_config(vocab_size=68)
    assert (cfg.dataset, cfg.tokenizer, cfg.valid_fraction) == ("tinyshakespeare", "chars", 0.1)
    assert (model.kind, model.n_layers, model.n_heads, model.d_model, model.max_len) == ("decoder-only", 4, 4, 128, 64)
    assert (model.dropout, model.bias) == (0.0, False)
    assert (cfg.batch_size, cfg.accum_steps, cfg.context, cfg.max_steps) == (12, 1, 0, 2000)
    assert (cfg.optimizer, cfg.betas, cfg.weight_decay, cfg.clip_norm) == ("adamw", [0.9, 0.99], 0.1, 1.0)
    schedule = (cfg.lr_schedule, cfg.peak_lr, cfg.min_lr, cfg.warmup, cfg.lr_decay_steps)
    assert schedule == ("cosine", 1e-3, 1e-4, 100, 2000)
    # auto: fp32 as nanoGPT on a CPU without native bf16, bf16 where the CPU has it
    assert (cfg.label_smoothing, cfg.precision, cfg.compile_loss, cfg.average_last) == (0.0, "auto", False, 0)
    assert cfg.eval_every == 250
