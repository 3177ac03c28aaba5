"""The training loop leaves its figures on the device: losses, norms, token counts and the
skip decision are read back to the host every ``log_every`` updates (and before an evaluation,
a checkpoint or the end), many updates' in one read. On a GPU each read is a synchronisation
that stalls the queue of kernels; counted here on the CPU (tests/host_reads.py), for both models.

The count is per update, over 80 updates minus 40, so that set-up and the end of the run
(the last validation, the last checkpoint) cancel out."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from host_reads import HostReads
from own_data import file_overrides
from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer

LOOP = ["log_every=10", "eval_every=1000", "save_every=1000", "eval_bleu=false", "threads=1", "progress=false"]


def lm_overrides(tmp_path: Path) -> list[str]:
    """A one-layer character model on a small made-up text (fp32: the reads of bf16 are the same)."""
    rng = random.Random(0)
    words = "the a cat dog sat ran on under mat log and then".split()
    text = "".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) + ".\n" for _ in range(200))
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return ["dataset=text", f"text_files=[{path}]", "tokenizer=chars", "model.preset=nanogpt-char",
            "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1", "model.max_len=16",
            "batch_size=4", "optimizer=adamw", "lr_schedule=cosine", "peak_lr=0.01", "warmup=2", "clip_norm=1.0",
            "precision=fp32"]


def reads_in_run(overrides: list[str], steps: int, run: Path) -> HostReads:
    trainer = Trainer(load_config(None, [*overrides, *LOOP, f"max_steps={steps}"]), run, log=lambda *a: None)
    with HostReads() as reads:
        trainer.train()
    return reads


@pytest.mark.parametrize("kind", ["translation", "language model"])
def test_at_most_half_a_host_read_per_update(kind, corpus, tmp_path):
    overrides = file_overrides(corpus) if kind == "translation" else lm_overrides(tmp_path)
    short = reads_in_run(overrides, 40, tmp_path / "short")
    long = reads_in_run(overrides, 80, tmp_path / "long")
    per_update = (long.count - short.count) / 40
    assert per_update <= 0.5, f"{per_update} reads per update; 80 updates: {long.where()}; 40: {short.where()}"
    assert long.count > short.count  # the counter counts: 4 more read-backs


def test_figures_are_read_back_at_log_points_and_before_checkpoints_and_the_end(corpus, tmp_path, monkeypatch):
    """Each read-back takes every update since the last: at the log points (10, 20), at the
    checkpoint (15) and at the last update (25)."""
    import transformer.train.trainer as trainer_module

    sizes, real = [], trainer_module.read_back
    monkeypatch.setattr(trainer_module, "read_back", lambda stats: sizes.append(len(stats)) or real(stats))
    cfg = load_config(None, [*file_overrides(corpus), *LOOP, "max_steps=25", "save_every=15"])
    trainer = Trainer(cfg, tmp_path / "run", log=lambda *a: None)
    assert trainer.train()["step"] == 25
    assert sizes == [10, 5, 5, 5]
