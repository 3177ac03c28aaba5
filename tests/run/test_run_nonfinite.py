"""Non-finite losses: an update whose loss is NaN is skipped (weights untouched) and logged
as ``skipped_step``; after ``max_bad_steps`` in a row the run stops with a UserError that
points at the last good checkpoint."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from transformer.errors import UserError
from transformer.run import checkpoint_dirs, latest_checkpoint, unique_state_dict
from transformer.train.trainer import Trainer


def nan_on_updates(trainer: Trainer, pred) -> None:
    """Make the training forward passes of update k (1-based) return NaN logits when pred(k).

    Patches only this trainer's model (its training-mode forward), so validation is untouched
    and the test does not depend on how train_step computes the loss."""
    model, real = trainer.model, trainer.model.forward
    calls = {"n": 0}

    def forward(*args, **kwargs):
        out = real(*args, **kwargs)
        if model.training:
            calls["n"] += 1  # accum_steps=1: one forward per update
            if pred(calls["n"]):
                out = out * float("nan")
        return out

    model.forward = forward


def test_isolated_nan_step_is_skipped_and_counted(tmp_path, make_cfg, metrics):
    trainer = Trainer(make_cfg("max_steps=5"), tmp_path / "run", log=lambda *a: None)
    nan_on_updates(trainer, lambda k: k == 3)
    result = trainer.train()
    assert result["step"] == 5 and result["reason"] == "max_steps"
    recs = metrics(tmp_path / "run")
    skipped = [r for r in recs if r.get("event") == "skipped_step"]
    assert len(skipped) == 1 and skipped[0]["step"] == 2  # the update after step 2 was skipped
    assert [r["step"] for r in recs if "event" not in r] == [1, 2, 3, 4, 5]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_persistent_nan_stops_with_user_error(tmp_path, make_cfg, metrics):
    run = tmp_path / "run"
    trainer = Trainer(make_cfg("max_steps=50", "save_every=2", "max_bad_steps=3"), run, log=lambda *a: None)
    nan_on_updates(trainer, lambda k: k > 4)  # steps 1-4 are fine, every later update is NaN
    with pytest.raises(UserError) as e:
        trainer.train()
    msg = str(e.value)
    assert "last good checkpoint" in msg and str(run) in msg and "\n" not in msg
    assert trainer.step == 4
    skipped = [r for r in metrics(run) if r.get("event") == "skipped_step"]
    assert len(skipped) == 3 and all(r["step"] == 4 for r in skipped)
    # The last good checkpoint exists, is complete and finite, and a run resumes from it.
    latest = latest_checkpoint(run)
    assert latest is not None and latest.name == "step-0000004"
    weights = load_file(str(latest / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    now = unique_state_dict(trainer.model)  # the skipped updates left the weights alone
    assert all(torch.equal(now[k], weights[k]) for k in weights)
    resumed = Trainer(make_cfg("max_steps=50", "save_every=2", "max_bad_steps=3", "max_steps=5"), run,
                      log=lambda *a: None)
    assert resumed.step == 4
    assert resumed.train()["step"] == 5
    recs = [r for r in metrics(run) if "event" not in r]
    assert math.isfinite(recs[-1]["loss"]) and recs[-1]["step"] == 5


def test_nan_stop_before_first_save_leaves_the_promised_checkpoint(tmp_path, make_cfg):
    run = tmp_path / "run"
    trainer = Trainer(make_cfg("max_steps=50", "save_every=1000", "max_bad_steps=2"), run, log=lambda *a: None)
    nan_on_updates(trainer, lambda k: k > 2)
    with pytest.raises(UserError, match="last good checkpoint"):
        trainer.train()
    assert checkpoint_dirs(run), "the error message promises a checkpoint that was never written"


def absurd_rate_at(trainer: Trainer, update: int) -> None:
    """Give update ``update`` a learning rate of 1e30 (finite, and absurd): its weights come
    out finite but so large that every later forward pass overflows."""
    real = trainer.lr
    trainer.lr = lambda step: 1e30 if step == update else real(step)


def test_absurd_rate_stops_at_once_and_keeps_the_good_checkpoints(tmp_path, make_cfg, metrics):
    run = tmp_path / "run"
    cfg = ("max_steps=50", "save_every=2", "precision=fp32")
    trainer = Trainer(make_cfg(*cfg), run, log=lambda *a: None)
    absurd_rate_at(trainer, 4)
    with pytest.raises(UserError) as e:
        trainer.train()
    msg = str(e.value)
    assert "update 4 " in msg and "lower peak_lr" in msg and "\n" not in msg
    assert f"last good checkpoint is {run / 'checkpoints' / 'step-0000002'}" in msg
    # stopped at the first non-finite loss, not after max_bad_steps of them
    assert len([r for r in metrics(run) if r.get("event") == "skipped_step"]) == 1
    # step 4's checkpoint holds the broken weights: set aside, not left for a resume to read
    assert [p.name for p in checkpoint_dirs(run)] == ["step-0000002"]
    assert (run / "checkpoints" / "corrupt-step-0000004").is_dir()
    weights = load_file(str(run / "checkpoints" / "step-0000002" / "model.safetensors"))
    assert all(torch.isfinite(t).all() and t.abs().max() < 100 for t in weights.values() if t.is_floating_point())
    resumed = Trainer(make_cfg(*cfg, "max_steps=6"), run, log=lambda *a: None)
    assert resumed.step == 2
    assert resumed.train()["step"] == 6
    assert all(math.isfinite(r["loss"]) for r in metrics(run) if "event" not in r and r["step"] > 2)


def test_absurd_peak_lr_saves_nothing(tmp_path, make_cfg):
    """Not a checkpoint, nor best.safetensors (the broken model's first BLEU, 0, beat none)."""
    run = tmp_path / "run"
    trainer = Trainer(make_cfg("max_steps=50", "save_every=1", "eval_every=1", "peak_lr=1e30", "warmup=1"), run,
                      log=lambda *a: None)
    with pytest.raises(UserError, match=r"^update 1 \(learning rate 1e\+30\) made the weights unusable.*"
                                        "no good checkpoint is left.*lower peak_lr"):
        trainer.train()
    assert checkpoint_dirs(run) == [] and not (run / "best.safetensors").exists()


def test_a_skip_is_found_at_the_next_read_back(tmp_path, make_cfg, metrics):
    """With log_every 5 the figures come back every 5 updates: the NaN of the third update is
    found at the fifth, which then counts 4 updates made; the skipped one gave its number back,
    so the run still makes its 10 updates, logged at steps 5 and 10."""
    trainer = Trainer(make_cfg("max_steps=10", "log_every=5"), tmp_path / "run", log=lambda *a: None)
    nan_on_updates(trainer, lambda k: k == 3)
    result = trainer.train()
    assert result["step"] == 10 and result["reason"] == "max_steps"
    recs = metrics(tmp_path / "run")
    assert [r["step"] for r in recs if r.get("event") == "skipped_step"] == [2]
    assert [r["step"] for r in recs if "event" not in r and "loss" in r] == [5, 10]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert trainer.optimizer.param_groups[0]["fused"]  # skipped on the device, not read on the host
    assert {int(s["step"]) for s in trainer.optimizer.state.values()} == {10}  # Adam counted made updates only


def test_persistent_nan_found_at_read_backs_still_stops(tmp_path, make_cfg):
    trainer = Trainer(make_cfg("max_steps=50", "log_every=5", "max_bad_steps=3"), tmp_path / "run",
                      log=lambda *a: None)
    nan_on_updates(trainer, lambda k: k > 4)
    with pytest.raises(UserError, match="^3 consecutive updates had a non-finite loss") as e:
        trainer.train()
    assert "\n" not in str(e.value) and trainer.step == 4
