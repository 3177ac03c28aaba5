"""benchmarks/seed_claims/run.py part 1 (training tokens/s against sequence length, RNN against
Transformer) with tiny settings on the CPU, the path a GPU run takes with --device cuda; and a
GPU asked for where there is none is a usage error, not a traceback."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(REPO / "benchmarks/seed_claims/run.py"), "--parts", "1", "--lengths", "8,16",
       "--tokens", "64", "--reps", "1", "--rounds", "1"]


def test_part_one_runs_on_the_cpu_and_records_its_device(tmp_path):
    r = subprocess.run([*RUN, "--device", "cpu", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    part = json.loads((tmp_path / "results.json").read_text())["throughput"]
    assert part["device"] == "cpu" and set(part["models"]) == {"transformer", "lstm+attn", "rnn+attn"}
    assert {(row["mode"], row["length"]) for row in part["rows"]} == {(m, n) for m in ("fixed", "batch-1") for n in (8, 16)}
    assert all(row["tokens_per_s"] > 0 for row in part["rows"])
    assert (tmp_path / "throughput.png").is_file() and "training tokens/s on the CPU" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --device cuda is no error")
def test_a_gpu_asked_for_where_there_is_none_is_a_usage_error(tmp_path):
    r = subprocess.run([*RUN, "--device", "cuda", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no CUDA GPU here" in r.stderr and "Traceback" not in r.stderr
