"""What a run directory holds after training (see the layout at the top of
train/checkpoint.py): keep_last, atomic checkpoint writes, best/averaged weights,
metrics, the learning curve and the saved config."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from transformer.run import checkpoint_dirs, load_model, read_weights
from transformer.train.trainer import Trainer

# Saves at 2 and 4 and (not a multiple of save_every) at the end, 5; evaluates at 3 and at the end.
RUN = ("max_steps=5", "save_every=2", "keep_last=2", "eval_every=3", "average_last=2")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, make_cfg) -> Path:
    run = tmp_path_factory.mktemp("ckpt") / "run"
    result = Trainer(make_cfg(*RUN), run, log=lambda *a: None).train()
    assert result == {**result, "step": 5, "reason": "max_steps"}
    return run


def test_only_keep_last_checkpoints_remain(finished):
    names = sorted(p.name for p in (finished / "checkpoints").iterdir())
    assert names == ["step-0000004", "step-0000005"]  # step-2 deleted; the last step always saved
    for d in checkpoint_dirs(finished):
        assert (d / "model.safetensors").is_file() and (d / "state.pt").is_file()
        assert read_weights(d / "model.safetensors")[2]["step"] == d.name.split("-")[1].lstrip("0")


def test_best_and_averaged_weights(finished):
    assert (finished / "best.safetensors").is_file()
    cfg, _, meta = read_weights(finished / "best.safetensors")
    assert meta["step"] in ("3", "5") and float(meta["valid_bleu"]) >= 0
    avg = load_file(str(finished / "averaged.safetensors"))
    a = load_file(str(finished / "checkpoints/step-0000004/model.safetensors"))
    b = load_file(str(finished / "checkpoints/step-0000005/model.safetensors"))
    assert avg.keys() == a.keys()
    for k in avg:
        torch.testing.assert_close(avg[k], (a[k].double() + b[k].double()).div(2).float())
    assert not all(torch.equal(a[k], b[k]) for k in a)  # the average is not trivially one of them
    # A run directory translates with the averaged weights first.
    _, meta = load_model(finished)
    assert meta["path"].endswith("averaged.safetensors")


def test_metrics_curve_and_config(finished, make_cfg, metrics):
    recs = metrics(finished)
    steps = [r["step"] for r in recs if "event" not in r]
    assert steps == [1, 2, 3, 4, 5]
    for r in recs:
        if "event" not in r:
            assert math.isfinite(r["loss"]) and r["lr"] > 0 and r["nll"] > 0
    evals = [r for r in recs if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [3, 5]
    assert all("valid_bleu" in r and math.isfinite(r["valid_nll"]) for r in evals)
    assert recs[-1]["event"] == "stop" and recs[-1]["reason"] == "max_steps" and recs[-1]["step"] == 5
    png = (finished / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    saved = yaml.safe_load((finished / "config.yaml").read_text())
    assert saved == make_cfg(*RUN).to_dict()
    assert (finished / "subwords.model").is_file()


def test_leftover_temporary_checkpoint_is_ignored_and_cleaned(finished, tmp_path, make_cfg, log):
    """A crash while writing a checkpoint leaves a .step-*.tmp directory, possibly holding
    complete-looking files for a later step; resume must not use it, and the next save
    removes it."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ckpts = run / "checkpoints"
    stale = ckpts / ".step-0000009.tmp"
    shutil.copytree(ckpts / "step-0000005", stale)
    (ckpts / ".step-0000006.k2j4h1x").mkdir()  # the name save_checkpoint's mkdtemp would give
    (ckpts / ".step-0000006.k2j4h1x" / "model.safetensors").write_bytes(b"\0" * 10)
    trainer = Trainer(make_cfg(*RUN[:-1], "max_steps=7"), run, log=log)
    assert trainer.step == 5
    assert "step-0000005" in log.text() and "0000009" not in log.text()
    trainer.train()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000006", "step-0000007"]


def test_checkpoint_dirs_ignores_incomplete(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-0000001").mkdir(parents=True)
    (root / "step-0000001" / "model.safetensors").write_bytes(b"x")  # no state.pt
    (root / ".step-0000002.tmp").mkdir()
    assert checkpoint_dirs(tmp_path) == []
