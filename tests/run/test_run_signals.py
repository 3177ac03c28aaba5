"""`transformer train` stopped with SIGTERM (what a cluster scheduler sends): it leaves a
complete checkpoint, exits 130 within seconds, and the run resumes from that step."""
from __future__ import annotations

import re
from pathlib import Path

import yaml
from tiny_corpus import TRANSFORMER, sigterm_after_first_checkpoint

from transformer.run import checkpoint_dirs, read_weights
from transformer.train.trainer import Trainer


def _config(tmp_path: Path, overrides: list[str]) -> Path:
    from transformer.train.train_config import apply_overrides

    data = apply_overrides({}, overrides)
    path = tmp_path / "sigterm.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_sigterm_saves_and_exits_130_then_resumes(tmp_path, run_overrides, make_cfg, log, metrics):
    config = _config(tmp_path, run_overrides + ["max_steps=1000000", "save_every=5"])
    run = tmp_path / "run"
    code, out, err, took = sigterm_after_first_checkpoint(
        [TRANSFORMER, "train", "--config", str(config), "--out", str(run)], run, wait=60, stop=20)
    assert code == 130, (out, err)
    assert took < 10, f"took {took:.1f} s to stop after SIGTERM"
    assert "Traceback" not in err + out
    stopped = re.search(r"stopped at step (\d+) \(SIGTERM\)", out)
    assert stopped, out
    step = int(stopped.group(1))
    assert step >= 5
    latest = checkpoint_dirs(run)[-1]
    assert latest.name == f"step-{step:07d}"  # the step it stopped at was saved, completely
    assert read_weights(latest / "model.safetensors")[2]["step"] == str(step)
    assert (latest / "state.pt").stat().st_size > 0
    assert not list((run / "checkpoints").glob(".step-*"))
    stop = metrics(run)[-1]
    assert stop["event"] == "stop" and stop["reason"] == "SIGTERM" and stop["step"] == step

    # Resume (same config, only max_steps lowered, which may change) continues from there.
    trainer = Trainer(make_cfg("max_steps=1000000", "save_every=5", f"max_steps={step + 2}"), run, log=log)
    assert trainer.step == step
    assert trainer.train()["step"] == step + 2
    assert f"(step {step})" in log.text()
