"""``transformer average`` writing into a run holds the run's writer lock (run/lock.py), as
``transformer train`` does: beside another writer it stops at once with one line naming the
other's pid, and writes nothing."""
from __future__ import annotations

import os
import shutil

from transformer.run import lock_run


def test_average_into_a_run_another_process_writes_stops_with_one_line(trained, tmp_path, cli, one_line_error):
    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    (run / "averaged.safetensors").unlink(missing_ok=True)
    held = lock_run(run)  # (a writer: flock is per open file, so this process's own second open conflicts)
    try:
        r = cli("average", "--model", run, "--last", 2)
        one_line_error(r, "average", run, f"(pid {os.getpid()}) is writing this run")
        assert not (run / "averaged.safetensors").exists()
        # averaging into another folder is no write to the run: it goes ahead
        elsewhere = tmp_path / "avg.safetensors"
        assert cli("average", "--model", run, "--last", 2, "--out", elsewhere).code == 0 and elsewhere.is_file()
    finally:
        held.release()
    r = cli("average", "--model", run, "--last", 2)
    assert r.code == 0, r.err
    assert (run / "averaged.safetensors").is_file() and not (run / ".lock").exists()  # released when done
    again = lock_run(run)  # and free again
    assert again is not None
    again.release()
