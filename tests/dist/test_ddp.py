"""Data-parallel training (two CPU processes, gloo) matches one process with the same global
batch, keeps the ranks' weights identical, resumes on another number of ranks, skips a
non-finite update on every rank when only one rank sees it, and stops cleanly on SIGTERM.

Tolerance: with fp32 and dropout 0 the two runs add the same gradients in a different
order, so losses agree to rel 1e-4 and weights to 1e-5 (measured: ~1e-7)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from dist_helpers import TORCHRUN, read_metrics, run_worker, train_records
from safetensors.torch import load_file
from tiny_corpus import build_once, sigterm_after_first_checkpoint

from transformer.run import checkpoint_dirs, read_weights
from transformer.train.checkpoint import load_training_state
from transformer.train.distributed import reshard_position
from transformer.train.trainer import Trainer

REL = 1e-4  # loss, relative
ATOL = 1e-5  # weights


def _close_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=ATOL, msg=k)


@pytest.fixture(scope="session")
def reference(tmp_path_factory, overrides) -> Path:
    """One process, accum_steps=2, 8 updates: the run the others must reproduce."""
    from transformer.train.train_config import load_config

    def train(base: Path) -> None:
        Trainer(load_config(None, overrides + ["accum_steps=2", "max_steps=8"]), base / "run",
                log=lambda *a: None).train()

    return build_once(tmp_path_factory, "dist-reference", train) / "run"


@pytest.fixture(scope="session")
def ddp(tmp_path_factory, overrides) -> Path:
    """Two ranks, accum_steps=1, 4 updates (checkpoints at 2 and 4), each rank's weights
    dumped; stdout.txt holds what the ranks printed."""
    def train(base: Path) -> None:
        done = run_worker(2, base / "run", base / "dump", overrides + ["max_steps=4"])
        assert done.returncode == 0, done.stderr[-3000:]
        (base / "stdout.txt").write_text(done.stdout)

    return build_once(tmp_path_factory, "dist-ddp", train)


def test_two_ranks_match_one_process_with_the_same_global_batch(reference, ddp):
    want, got = train_records(reference), train_records(ddp / "run")
    assert sorted(got) == [1, 2, 3, 4]
    worst = 0.0
    for step in got:
        assert got[step]["lr"] == want[step]["lr"]
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=REL), step
        worst = max(worst, abs(got[step]["loss"] - want[step]["loss"]) / want[step]["loss"])
    print(f"largest relative loss difference, 2 ranks vs 1 process: {worst:.2e}")
    # The same global token count per update: the loss is normalised by all ranks' tokens.
    for step in got:
        assert got[step]["tgt_tokens_per_s"] > 0
    # Rank 0 alone writes: one log line per step, one "global batch" line.
    assert (ddp / "stdout.txt").read_text().count("global batch: 2 rank(s) x 1 micro-batch(es)") == 1
    ref4 = read_weights(reference.parent / "run/checkpoints/step-0000004/model.safetensors")[1]
    _close_weights(load_file(str(ddp / "run/checkpoints/step-0000004/model.safetensors")), ref4)


def test_ranks_hold_identical_weights(ddp):
    r0, r1 = (load_file(str(ddp / f"dump/rank{r}.safetensors")) for r in (0, 1))
    assert all(torch.equal(r0[k], r1[k]) for k in r0), "the ranks' weights diverged"
    saved = read_weights(ddp / "run/checkpoints/step-0000004/model.safetensors")[1]
    assert all(torch.equal(r0[k], saved[k]) for k in r0)
    state = load_training_state(ddp / "run/checkpoints/step-0000004")
    assert state["world_size"] == 2 and len(state["rng_per_rank"]) == 2
    assert state["sampler"]["batch_in_epoch"] == 4  # per rank: 8 of the epoch's batches done


def test_resume_on_one_rank_then_two(reference, ddp, overrides, tmp_path):
    """2 ranks x accum 1 (steps 1-4) -> 1 process x accum 2 (5-6) -> 2 ranks x accum 1 (7-8):
    the global batch never changes, so the run follows the reference."""
    run = tmp_path / "run"
    shutil.copytree(ddp / "run", run)
    from transformer.train.train_config import load_config

    lines: list[str] = []
    trainer = Trainer(load_config(None, overrides + ["accum_steps=2", "max_steps=6"]), run, log=lines.append)
    assert trainer.step == 4
    assert trainer.sampler.state_dict()["batch_in_epoch"] == 8  # 4 per rank x 2 ranks
    assert any("resuming on 1 rank(s) a run saved on 2" in x for x in lines), lines
    assert not any("batch(es) skipped" in x or "global batch changes" in x for x in lines), lines
    assert trainer.train()["step"] == 6
    done = run_worker(2, run, tmp_path / "dump", overrides + ["max_steps=8"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming on 2 rank(s) a run saved on 1" in done.stdout
    want, got = train_records(reference), train_records(run)
    assert sorted(got) == list(range(1, 9))
    for step in range(1, 9):
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=REL), step
    _close_weights(read_weights(run / "checkpoints/step-0000008/model.safetensors")[1],
                   read_weights(reference / "checkpoints/step-0000008/model.safetensors")[1])


@pytest.mark.parametrize("old,new,b,want,skipped", [
    (2, 1, 4, 8, 0), (1, 2, 6, 3, 0), (2, 4, 4, 2, 0),
    (3, 2, 3, 5, 1),  # 9 batches done: 2 ranks continue at batch 10, skipping one
    (1, 4, 5, 2, 3),
])
def test_reshard_position_never_repeats_and_skips_fewer_than_new_world(old, new, b, want, skipped):
    state = {"epoch": 3, "batch_in_epoch": b, "seed": 7}
    got, n = reshard_position(state, old, new)
    assert got == {"epoch": 3, "batch_in_epoch": want, "seed": 7} and n == skipped
    assert 0 <= want * new - b * old < new


def test_nan_on_one_rank_skips_the_update_on_all(overrides, tmp_path):
    """Rank 1 alone makes NaN logits on updates 2, 5 and 6: both ranks skip update 2, then stop
    after two bad updates in a row with a clear error, keeping the last good checkpoint."""
    run, dump = tmp_path / "run", tmp_path / "dump"
    done = run_worker(2, run, dump, overrides + ["max_steps=50", "save_every=1000", "max_bad_steps=2"],
                      extra_env={"NAN_UPDATES": "2,5,6"})
    assert done.returncode != 0
    errors = [x for x in done.stderr.splitlines() if ": error: " in x]
    assert sorted(x.split(":")[0] for x in errors) == ["rank 0", "rank 1"], done.stderr[-3000:]
    assert all("2 consecutive updates had a non-finite loss" in x and "step-0000003" in x for x in errors)
    recs = read_metrics(run)
    assert [r["step"] for r in recs if r.get("event") == "skipped_step"] == [1, 3, 3]
    assert [r["step"] for r in recs if "event" not in r] == [1, 2, 3]
    assert [p.name for p in checkpoint_dirs(run)] == ["step-0000003"]
    r0, r1 = (load_file(str(dump / f"rank{r}.safetensors")) for r in (0, 1))
    saved = read_weights(run / "checkpoints/step-0000003/model.safetensors")[1]
    assert all(torch.equal(r0[k], r1[k]) and torch.equal(r0[k], saved[k]) for k in r0)
    assert all(torch.isfinite(t).all() for t in saved.values())


def test_sigterm_to_torchrun_saves_once_and_stops(overrides, tmp_path):
    """`torchrun -m transformer train` (the real command line), SIGTERM to torchrun: it
    passes the signal to both ranks, which agree on the step, save once and exit."""
    import yaml

    from transformer.train.train_config import apply_overrides

    run, config = tmp_path / "run", tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(apply_overrides({}, overrides + ["max_steps=1000000", "save_every=5"])))
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "transformer", "train",
           "--config", str(config), "--out", str(run)]
    _, out, err, took = sigterm_after_first_checkpoint(cmd, run, wait=90, stop=40)
    assert took < 20, f"took {took:.1f} s to stop after SIGTERM"
    stopped = [x for x in out.splitlines() if x.startswith("stopped at step")]
    assert len(stopped) == 1 and "(SIGTERM)" in stopped[0], (out, err[-3000:])
    step = int(stopped[0].split()[3])
    latest = checkpoint_dirs(run)[-1]
    assert latest.name == f"step-{step:07d}"
    assert load_training_state(latest)["world_size"] == 2
    recs = read_metrics(run)
    stops = [r for r in recs if r.get("event") == "stop"]
    assert len(stops) == 1 and stops[0]["reason"] == "SIGTERM" and stops[0]["step"] == step
    assert not list((run / "checkpoints").glob(".step-*"))


def test_a_run_another_train_holds_is_refused_on_every_rank(overrides, tmp_path):
    """Rank 0 alone takes the run's lock; when another train holds it, every rank stops with
    the same one-line error (none left waiting at a collective) and nothing is written."""
    import os

    from transformer.run.lock import lock_run

    run, dump = tmp_path / "run", tmp_path / "dump"
    lock = lock_run(run)  # this test process is "the other train"
    try:
        done = run_worker(2, run, dump, overrides + ["max_steps=2"])
    finally:
        lock.release()
    assert done.returncode != 0
    errors = [x for x in done.stderr.splitlines() if ": error: " in x]
    assert sorted(x.split(":")[0] for x in errors) == ["rank 0", "rank 1"], done.stderr[-3000:]
    assert all(f"another transformer train (pid {os.getpid()}) is writing this run" in x for x in errors)
    assert not run.exists() or not any(run.iterdir())
