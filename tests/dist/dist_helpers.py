"""Helpers for the data-parallel tests: the synthetic corpus and ``torchrun`` launches of
CPU processes (gloo) on one machine (imported by conftest.py and the tests)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WORKER = str(Path(__file__).with_name("ddp_worker.py"))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, also for the torchrun workers
from tiny_corpus import write_corpus  # noqa: E402,F401  (the corpus every test folder shares)


def shared_dir(tmp_path_factory) -> Path:
    """A folder shared by all xdist workers of this session."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def torchrun(nproc: int, *args: str, extra_env: dict | None = None, timeout: float = 120):
    """Run ``torchrun --standalone`` (a free port of its own) with ``nproc`` CPU processes."""
    cmd = [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**env(), **(extra_env or {})}, timeout=timeout)


def run_worker(nproc: int, run_dir: Path, dump: Path, overrides: list[str], extra_env: dict | None = None):
    """Train with :mod:`ddp_worker` on ``nproc`` ranks; each rank leaves its final weights
    in ``dump/rank{r}.safetensors``."""
    dump.mkdir(parents=True, exist_ok=True)
    return torchrun(nproc, WORKER, run_dir, dump, *overrides, extra_env=extra_env)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def train_records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir) if "event" not in r and "loss" in r}
