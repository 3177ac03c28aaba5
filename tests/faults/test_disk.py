"""A full disk or an unwritable run directory while saving: a clear one-line UserError, the
previous checkpoint intact and loadable, no temporary left behind, and the run resumes
from that checkpoint once the disk has room again."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from transformer.errors import UserError
from transformer.run import checkpoint_dirs
from transformer.run import files as run_files
from transformer.run import weights as run_weights
from transformer.train import checkpoint as ckpt
from transformer.train.trainer import Trainer


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, make_cfg) -> Path:
    """A run with one checkpoint, at step 2 (and best.safetensors from the final evaluation)."""
    run = tmp_path_factory.mktemp("disk") / "run"
    Trainer(make_cfg("max_steps=2", "save_every=2"), run, log=lambda *a: None).train()
    return run


@pytest.fixture
def run(two_steps, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(two_steps, dst)
    return dst


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def _assert_intact(run: Path, before: dict[str, bytes]) -> None:
    assert [p.name for p in checkpoint_dirs(run)] == ["step-0000002"]
    assert _snapshot(run / "checkpoints/step-0000002") == before
    run_weights.read_weights(run / "checkpoints/step-0000002/model.safetensors")
    ckpt.load_training_state(run / "checkpoints/step-0000002")
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")], "temporary left behind"


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["weights", "state"])
def test_disk_full_in_mid_checkpoint(run, make_cfg, monkeypatch, where):
    before = _snapshot(run / "checkpoints/step-0000002")
    trainer = Trainer(make_cfg("max_steps=4", "save_every=2"), run, log=lambda *a: None)
    if where == "weights":  # the weights file half-written, then the disk is full
        real = run_weights.save_file

        def save_file(tensors, path, metadata=None):
            real(tensors, path, metadata=metadata)
            Path(path).write_bytes(Path(path).read_bytes()[:1000])
            _enospc()

        monkeypatch.setattr(run_weights, "save_file", save_file)
    else:
        monkeypatch.setattr(ckpt.torch, "save", _enospc)
    with pytest.raises(UserError) as e:
        trainer.train()
    msg = str(e.value)
    assert "No space left on device" in msg and "previous checkpoint is intact" in msg and "\n" not in msg
    _assert_intact(run, before)
    monkeypatch.undo()  # room again: the run resumes from step 2
    resumed = Trainer(make_cfg("max_steps=4", "save_every=2"), run, log=lambda *a: None)
    assert resumed.step == 2
    assert resumed.train()["step"] == 4


def test_unwritable_run_dir_while_saving(run, make_cfg, monkeypatch):
    """Permission denied on the checkpoint folder (as root chmod does not block writes, so
    the refusal is simulated where the checkpoint's temporary folder is created)."""
    before = _snapshot(run / "checkpoints/step-0000002")
    trainer = Trainer(make_cfg("max_steps=3", "save_every=1"), run, log=lambda *a: None)

    def mkdtemp(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(run / "checkpoints"))

    monkeypatch.setattr(run_files.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(UserError, match="could not save a checkpoint .Permission denied.; the previous"):
        trainer.train()
    _assert_intact(run, before)


def test_disk_full_writing_metrics_or_best_weights(run, make_cfg, monkeypatch):
    trainer = Trainer(make_cfg("max_steps=3", "eval_every=3"), run, log=lambda *a: None)
    best = (run / "best.safetensors").read_bytes()
    real_open = os.open

    def full_open(path, flags, *args, **kwargs):  # metrics.jsonl is appended through os.open (no link followed)
        if str(path).endswith("metrics.jsonl") and flags & os.O_APPEND:
            _enospc()
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_open)
    with pytest.raises(UserError, match="metrics.jsonl: cannot write .No space left on device."):
        trainer.train()
    monkeypatch.undo()

    trainer = Trainer(make_cfg("max_steps=3", "eval_every=3"), run, log=lambda *a: None)
    trainer.best_bleu = -1.0  # so that the evaluation at step 3 writes best.safetensors
    import safetensors.torch

    real = safetensors.torch.save_file

    def half_then_full(tensors, path, metadata=None):
        real(tensors, path, metadata=metadata)
        Path(path).write_bytes(Path(path).read_bytes()[:500])
        _enospc()

    monkeypatch.setattr(run_weights, "save_file", half_then_full)  # best.safetensors goes through atomic_write
    with pytest.raises(UserError, match="best.safetensors: cannot write .No space left on device.; any earlier"):
        trainer.train()
    assert (run / "best.safetensors").read_bytes() == best
    assert not list(run.glob(".best.safetensors.*"))


# ---- a real full disk -------------------------------------------------------------------------
# The tests above inject OSError; a real full disk reaches the writers through libraries that
# wrap it (safetensors: SafetensorError "... (os error 28)"; torch.save: RuntimeError
# "unexpected pos"). Here the disk is a real 8 MiB tmpfs, filled up to ROOM before the save.

@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB tmpfs mounted at tmp_path/disk (root only), unmounted after the test."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("real full-disk test: needs root to mount a small tmpfs (not root here)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"real full-disk test: cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path, room: int) -> Path:
    """A file taking all the free space of ``disk`` but ``room`` bytes."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - room, 0))
    return filler


@pytest.mark.parametrize("room", [300_000, 1_000_000], ids=["weights-do-not-fit", "state-does-not-fit"])
def test_real_full_disk_one_line_then_exact_resume(small_disk, room, write_config, make_cfg, tmp_path, capsys):
    """A checkpoint that does not fit on a real full disk: exit 2 with one line on stderr,
    the previous checkpoint intact, no temporary left; with room again the run resumes and
    ends bit-identical to an uninterrupted run. (The toy model's weights take 0.7 MB, its
    training state 1.5 MB: with 0.3 MB left safetensors fails, with 1 MB torch.save does.)"""
    from safetensors.torch import load_file

    from transformer.cli import main

    steps = ("max_steps=4", "save_every=2")
    config = write_config(tmp_path / "c.yaml", *steps)
    run = small_disk / "run"
    Trainer(make_cfg("max_steps=2", "save_every=2"), run, log=lambda *a: None).train()
    before = _snapshot(run / "checkpoints/step-0000002")
    best = (run / "best.safetensors").read_bytes()
    filler = _fill(small_disk, room)
    capsys.readouterr()

    assert main(["train", "--config", str(config), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"transformer train: error: {run}: could not save a checkpoint (No space left on "
                                "device); the previous checkpoint is intact"], err
    _assert_intact(run, before)
    assert (run / "best.safetensors").read_bytes() == best
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")], "temporary or lock left behind"

    filler.unlink()  # room again
    assert main(["train", "--config", str(config), "--out", str(run)]) == 0
    alone = tmp_path / "alone"
    Trainer(make_cfg(*steps), alone, log=lambda *a: None).train()
    for name in ("checkpoints/step-0000004/model.safetensors", "best.safetensors"):
        mine, theirs = load_file(run / name), load_file(alone / name)
        assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine), name


def test_an_atomic_write_keeps_the_replaced_files_mode_and_syncs_its_folder(tmp_path, monkeypatch):
    """The rename that ends an atomic write is made durable (the folder fsynced, as checkpoints
    are), and a file it replaces keeps its permissions; a new file gets the usual ones."""
    synced = []
    monkeypatch.setattr(run_files, "fsync_dir", lambda path: synced.append(Path(path)))
    old = os.umask(0o022)
    try:
        private = tmp_path / "private.txt"
        private.write_text("a")
        private.chmod(0o640)
        run_files.write_text_atomic(private, "b")
        run_files.write_text_atomic(tmp_path / "new.txt", "c")
    finally:
        os.umask(old)
    assert private.read_text() == "b" and (private.stat().st_mode & 0o777) == 0o640
    assert ((tmp_path / "new.txt").stat().st_mode & 0o777) == 0o644
    assert synced == [tmp_path, tmp_path]
