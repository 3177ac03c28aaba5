"""SIGKILL at random moments (start-up, subword learning, a step, a checkpoint write, a
deletion of an old checkpoint, a best-weights write): the run directory never holds a
corrupt file, each restart resumes from the newest complete checkpoint, and the run
finally reaches max_steps with a clean history (each step logged once)."""
from __future__ import annotations

import json
import random
import re
import subprocess
import time

from fault_helpers import TRANSFORMER, check_run_dir, subprocess_env

from transformer.run import checkpoint_dirs
from transformer.inference.translator import load_translator

KILLS = 3
MORE = 10  # steps the last, uninterrupted start trains after the last kill


def _latest_step(run) -> int:
    dirs = checkpoint_dirs(run)
    return int(dirs[-1].name.split("-")[1]) if dirs else 0


def test_sigkill_at_random_moments_never_corrupts_the_run(tmp_path, write_config):
    # save_every=1: most of a step's time is the checkpoint write, so kills often land in one;
    # keep_last=2: old checkpoints are deleted all the time; eval_every=6: best.safetensors too.
    # max_steps out of reach: a kill always comes first, however fast the machine.
    config = write_config(tmp_path / "kill.yaml", "max_steps=1000000", "save_every=1", "keep_last=2",
                          "eval_every=6", "valid_limit=10")
    run = tmp_path / "run"
    argv = [TRANSFORMER, "train", "--config", str(config), "--out", str(run)]
    rng = random.Random(6)
    resumed_from, moments = [], []
    for kill in range(KILLS):
        before = _latest_step(run)
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=subprocess_env())
        try:
            if kill == 0:
                time.sleep(rng.uniform(0.5, 3.0))  # anywhere from imports to the first steps
            else:  # some progress first, then a random moment of the steps that follow
                deadline = time.monotonic() + 60
                while _latest_step(run) <= before and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.3))
            assert proc.poll() is None, f"finished before kill {kill}: {proc.communicate()}"
        finally:
            proc.kill()
            out, err = proc.communicate()
        assert "Traceback" not in err, err[-3000:]
        check_run_dir(run)
        assert not list(run.glob("checkpoints/corrupt-*")) and "warning:" not in out  # nothing damaged
        moments.append(f"kill {kill}: {time.monotonic() - t0:.1f} s after start, newest checkpoint {_latest_step(run)}")
        said = re.search(r"resumed from \S*step-(\d+) \(step (\d+)\)", out)
        if said:  # it got as far as resuming: from the newest complete checkpoint
            assert int(said.group(1)) == before, (out, before)
            resumed_from.append(before)

    latest = _latest_step(run)
    assert latest > 0
    max_steps = latest + MORE
    done = subprocess.run([*argv, "--set", f"max_steps={max_steps}"], capture_output=True, text=True,
                          env=subprocess_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"step-{latest:07d} (step {latest})" in done.stdout
    check_run_dir(run, finished=True)
    assert _latest_step(run) == max_steps
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "event" not in r] == list(range(1, max_steps + 1))
    assert recs[-1]["event"] == "stop" and recs[-1]["reason"] == "max_steps"
    assert load_translator(run, beam=1).translate(["red dog"])[0] is not None
    print("\n".join(moments), f"\nresumed from {resumed_from} then {latest}")
