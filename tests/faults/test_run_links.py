"""A run folder someone hands over cannot make transformer write outside it: a symbolic link
where a run file should be (``.lock``, ``metrics.jsonl``, ``config.yaml``, ``checkpoints/``)
is refused in one line before anything is written, and the file it names is untouched.
Before, ``average`` and ``train`` opened ``RUN/.lock`` through the link and wrote their pid
into the file it named."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fault_helpers import TRANSFORMER, subprocess_env

from transformer.errors import UserError
from transformer.run import files, lock
from transformer.run.files import open_to_append
from transformer.run.lock import LOCK, lock_run
from transformer.train.trainer import Trainer

VICTIM_TEXT = "the user's own file\n"


def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    victim = tmp_path / "outside" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(VICTIM_TEXT)
    return victim


def _listing(run: Path) -> dict[str, bytes | str]:
    """Every entry of the run: a file's bytes, a link's target."""
    out = {}
    for top, dirs, names in os.walk(run):
        for name in dirs + names:
            p = Path(top) / name
            if p.is_symlink():
                out[str(p.relative_to(run))] = "-> " + os.readlink(p)
            elif p.is_file():
                out[str(p.relative_to(run))] = p.read_bytes()
    return out


def _cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([TRANSFORMER, *map(str, argv)], capture_output=True, text=True, env=subprocess_env(),
                          timeout=300)


@pytest.mark.parametrize("command", ["average", "train"])
def test_a_lock_file_linked_outside_is_refused_and_its_target_untouched(command, four_steps_copy, tmp_path,
                                                                         write_config):
    run = four_steps_copy
    victim = _victim(tmp_path)
    (run / LOCK).symlink_to(victim)
    before = _listing(run)
    if command == "average":
        done = _cli("average", "--model", run, "--last", "2")
    else:
        done = _cli("train", "--config", write_config(tmp_path / "more.yaml", "max_steps=6", "save_every=2",
                                                       "keep_last=5"), "--out", run)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"transformer {command}: error: {run / LOCK}: a symbolic link inside the run {run}; transformer writes "
        "nothing through links in a run (the file it names, outside the run, would change): remove the link, "
        "or put the file itself there"]
    assert victim.read_text() == VICTIM_TEXT
    assert _listing(run) == before  # nothing written, the link left for the user to see


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.yaml", "best.safetensors", "checkpoints",
                                  "checkpoints/step-0000004/state.pt"])
def test_train_refuses_a_run_holding_a_link_where_its_files_should_be(name, four_steps_copy, tmp_path, make_cfg):
    run = four_steps_copy
    victim = _victim(tmp_path)
    if (run / name).is_dir():  # the folder moved outside and linked back: checkpoints would be written there
        target = tmp_path / "outside" / "checkpoints"
        (run / name).rename(target)
    else:
        target = victim
        (run / name).unlink()
    (run / name).symlink_to(target)
    outside = _listing(tmp_path / "outside")
    with pytest.raises(UserError) as refused:
        Trainer(make_cfg("max_steps=6", "save_every=2", "keep_last=1"), run, log=lambda *a: None).train()
    assert str(refused.value).startswith(f"{run / name}: a symbolic link inside the run ")
    assert _listing(tmp_path / "outside") == outside  # no checkpoint pruned or written there, no metrics appended
    assert not (run / LOCK).exists()


def test_the_lock_is_never_opened_through_a_link_made_after_the_check(tmp_path, monkeypatch):
    """O_NOFOLLOW: a link that appears between the folder's check and the open is refused too."""
    run = tmp_path / "run"
    run.mkdir()
    victim = _victim(tmp_path)
    (run / LOCK).symlink_to(victim)
    monkeypatch.setattr(lock, "refuse_links", lambda folder: None)  # as if the link came after the check
    with pytest.raises(UserError, match="cannot write"):
        lock_run(run)
    assert victim.read_text() == VICTIM_TEXT


def test_metrics_are_never_appended_through_a_link(tmp_path):
    victim = _victim(tmp_path)
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        open_to_append(link)
    assert victim.read_text() == VICTIM_TEXT
    with open_to_append(tmp_path / "new.jsonl") as f:  # a plain file is made and appended to
        f.write("a\n")
    with open_to_append(tmp_path / "new.jsonl") as f:
        f.write("b\n")
    assert (tmp_path / "new.jsonl").read_text() == "a\nb\n"


def test_a_link_anywhere_inside_is_named_and_the_folder_itself_may_be_one(tmp_path):
    real = tmp_path / "real-run"
    (real / "checkpoints" / "step-1").mkdir(parents=True)
    (real / "config.yaml").write_text("x: 1\n")
    alias = tmp_path / "alias"
    alias.symlink_to(real, target_is_directory=True)
    files.refuse_links(alias)  # the user named the folder: a link to it is theirs to make
    (real / "checkpoints" / "step-1" / "model.safetensors").symlink_to(_victim(tmp_path))
    with pytest.raises(UserError, match="step-1/model.safetensors: a symbolic link inside the run"):
        files.refuse_links(alias)
