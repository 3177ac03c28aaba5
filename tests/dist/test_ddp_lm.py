"""Data-parallel training of the language model: two CPU ranks (gloo) with one micro-batch
each equal one process with two micro-batches per update (the ranks take interleaved draws
of the same window sequence), and the ranks' weights stay identical."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from dist_helpers import read_metrics, run_worker, train_records
from safetensors.torch import load_file

from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lm"))
from lm_text import make_text  # noqa: E402


def lm_overrides(text: Path) -> list[str]:
    return [f"dataset=text", f"text_files=[{text}]", "tokenizer=chars", "model.preset=nanogpt-char",
            "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=1", "model.max_len=16",
            "batch_size=4", "optimizer=adamw", "weight_decay=0.1", "lr_schedule=cosine", "peak_lr=0.01",
            "min_lr=0.001", "warmup=2", "precision=fp32", "progress=false", "threads=1", "log_every=1",
            "eval_every=1000", "save_every=4", "max_steps=4"]


def test_two_ranks_equal_one_process_with_their_micro_batches(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text(make_text(), encoding="utf-8")
    one = tmp_path / "one"
    Trainer(load_config(None, lm_overrides(text) + ["accum_steps=2"]), one, log=lambda *a: None).train()
    done = run_worker(2, tmp_path / "two", tmp_path / "dump", lm_overrides(text))
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = [load_file(str(tmp_path / "dump" / f"rank{r}.safetensors")) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # the ranks agree bit for bit
    ref = load_file(str(one / "checkpoints/step-0000004/model.safetensors"))
    for k in ref:
        torch.testing.assert_close(ranks[0][k], ref[k], rtol=0, atol=1e-5, msg=k)
    a, b = train_records(one), train_records(tmp_path / "two")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert abs(a[step]["loss"] - b[step]["loss"]) <= 1e-4 * abs(a[step]["loss"])
        assert a[step]["tgt_tokens_per_s"] > 0 and b[step]["lr"] == a[step]["lr"]
    assert [r for r in read_metrics(tmp_path / "two") if r.get("event") == "stop"]
