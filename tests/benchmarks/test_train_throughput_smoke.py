"""benchmarks/train_throughput.py: its three measurements (the main table, time against
length, peak memory) run end to end with tiny shapes and report what the README tables use."""
import json
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "train_throughput.py"
TINY = ["--batch", "4", "--src-len", "6", "--tgt-len", "6", "--vocab", "300", "--rounds", "1", "--steps", "1",
        "--dtypes", "fp32", "--matmul-sizes", "256"]  # the default sizes take 80 s at fp32 on an AVX2 CPU
IMPLS = {"ours", "torch.nn.Transformer", "HF MarianMTModel"}


def run(tmp_path, *extra):
    out = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, str(SCRIPT), *TINY, *extra, "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("machine: ")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(row["machine"]["capability"] for row in rows)
    return r.stdout, rows


def test_throughput_table_has_every_implementation_with_ratio_and_mfu(tmp_path):
    stdout, rows = run(tmp_path)
    assert {r["impl"] for r in rows} == IMPLS
    ref = next(r for r in rows if r["impl"] == "torch.nn.Transformer")
    assert ref["ratio"] == 1.0
    for r in rows:
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
    assert "| ours |" in stdout


def test_lengths_and_memory(tmp_path):
    stdout, rows = run(tmp_path, "--lengths", "3,6", "--memory")
    timed = [r for r in rows if "length" in r]
    assert {(r["impl"], r["length"]) for r in timed} == {(i, L) for i in IMPLS for L in (3, 6)}
    assert {r["batch"] for r in timed if r["length"] == 3} == {8}  # the same 24 target tokens per batch
    assert all(r["us_per_target_token"] > 0 for r in timed)
    peaks = {r["impl"]: r["peak_rss_mib"] for r in rows if "peak_rss_mib" in r}
    assert set(peaks) == IMPLS | {"none"}
    assert all(peaks[i] > peaks["none"] > 0 for i in IMPLS)  # a model and a step cost memory
    assert "L=6 / L=3" in stdout and "peak memory" in stdout


def test_bad_lengths_are_one_line_errors():
    for bad in ("0,16", "300", "8,x"):
        r = subprocess.run([sys.executable, str(SCRIPT), "--lengths", bad], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (bad, r.stderr)
        assert "--lengths" in r.stderr and "Traceback" not in r.stderr


def test_compile_loss_races_a_second_copy_of_ours(tmp_path):
    stdout, rows = run(tmp_path, "--compile-loss")
    assert {r["impl"] for r in rows} == IMPLS | {"ours, compiled loss"}
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert "| ours, compiled loss |" in stdout
