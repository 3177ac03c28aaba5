"""One writer per run: a second ``transformer train`` on a run that another one is writing
stops at once with one line naming the first one's pid, and leaves the first one's run as
if it had been alone; the lock goes with its holder (released at the end, dropped by the
kernel on a crash), and readers never take it."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_helpers import TRANSFORMER, check_run_dir, subprocess_env
from safetensors.torch import load_file

from transformer.errors import UserError
from transformer.run import checkpoint_dirs
from transformer.run.lock import LOCK, lock_run
from transformer.train.trainer import Trainer

LONG = ("max_steps=12", "save_every=4", "keep_last=5", "eval_every=6")


def _wait_for_lock(run: Path, pid: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if (run / LOCK).read_text().strip() == str(pid):
                return
        except OSError:
            pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the first train never took the lock")


def _weights(run: Path) -> dict[str, dict]:
    return {d.name: load_file(d / "model.safetensors") for d in checkpoint_dirs(run)}


def test_second_train_stops_at_once_and_the_first_is_unharmed(tmp_path, write_config, make_cfg):
    config = write_config(tmp_path / "lock.yaml", *LONG)
    run = tmp_path / "run"
    argv = [TRANSFORMER, "train", "--config", str(config), "--out", str(run)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        _wait_for_lock(run, first.pid, first)
        os.kill(first.pid, signal.SIGSTOP)  # frozen while it holds the lock: the second surely meets it
        try:
            second = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), timeout=120)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert second.returncode == 2
    assert second.stderr.splitlines() == [
        f"transformer train: error: {run}: another transformer train (pid {first.pid}) is writing this run; "
        "wait for it to finish, or use another --out"]
    assert second.stdout == ""
    assert first.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    check_run_dir(run, finished=True)
    assert not (run / LOCK).exists(), "the lock file outlived its holder's clean exit"

    alone = tmp_path / "alone"
    Trainer(make_cfg(*LONG), alone, log=lambda *a: None).train()
    mine, theirs = _weights(run), _weights(alone)
    assert list(mine) == list(theirs) == ["step-0000004", "step-0000008", "step-0000012"]
    for name in mine:
        assert mine[name].keys() == theirs[name].keys()
        assert all(mine[name][k].equal(theirs[name][k]) for k in mine[name]), f"{name} differs from a run alone"
    assert load_file(run / "best.safetensors").keys() == load_file(alone / "best.safetensors").keys()
    assert all(a.equal(b) for a, b in zip(load_file(run / "best.safetensors").values(),
                                          load_file(alone / "best.safetensors").values()))


def test_lock_is_held_for_the_trainers_life(tmp_path, make_cfg):
    """In one process too (flock locks an open file, not a process): a second Trainer is
    refused, naming this pid, until the first one's train() returns."""
    run = tmp_path / "run"
    first = Trainer(make_cfg("max_steps=2"), run, log=lambda *a: None)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(UserError, match=f"another transformer train .pid {os.getpid()}. is writing this run"):
        Trainer(make_cfg("max_steps=2"), run, log=lambda *a: None)
    assert sorted(p.name for p in run.iterdir()) == before  # the refused one touched nothing
    first.train()
    assert not (run / LOCK).exists()
    Trainer(make_cfg("max_steps=3"), run, log=lambda *a: None).train()  # free again


def test_lock_of_a_dead_process_is_taken_over(tmp_path, make_cfg):
    """SIGKILL leaves the file (the kernel drops the lock itself): the next start takes it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("999999999\n")
    Trainer(make_cfg("max_steps=1"), run, log=lambda *a: None).train()
    assert checkpoint_dirs(run) and not (run / LOCK).exists()


def test_failed_start_releases_the_lock_and_leaves_no_folder(tmp_path, make_cfg):
    run = tmp_path / "new" / "run"
    with pytest.raises(UserError, match="/nonexistent/train.src"):
        Trainer(make_cfg("max_steps=1", "train_src=/nonexistent/train.src"), run, log=lambda *a: None)
    assert not run.exists()
    Trainer(make_cfg("max_steps=1"), run, log=lambda *a: None).train()


def test_readers_do_not_take_the_lock(four_steps_copy):
    """translate reads a run while its training holds the lock."""
    from transformer.inference.translator import load_translator

    lock = lock_run(four_steps_copy)
    try:
        assert len(load_translator(four_steps_copy, warn=False).translate(["red dog runs"])) == 1
        with pytest.raises(UserError, match=f"pid {os.getpid()}"):
            lock_run(four_steps_copy)
    finally:
        lock.release()
    assert not (four_steps_copy / LOCK).exists()
