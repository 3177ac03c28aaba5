"""Helpers for the data-parallel tests: ``torchrun`` launches of CPU processes (gloo) on one
machine, and the training records they leave (imported by the tests)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WORKER = str(Path(__file__).with_name("ddp_worker.py"))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, also for the torchrun workers
from tiny_corpus import process_env as env  # noqa: E402
from tiny_corpus import read_metrics  # noqa: E402


def torchrun(nproc: int, *args: str, extra_env: dict | None = None, timeout: float = 120):
    """Run ``torchrun --standalone`` (a free port of its own) with ``nproc`` CPU processes."""
    cmd = [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**env(), **(extra_env or {})}, timeout=timeout)


def run_worker(nproc: int, run_dir: Path, dump: Path, overrides: list[str], extra_env: dict | None = None):
    """Train with :mod:`ddp_worker` on ``nproc`` ranks; each rank leaves its final weights
    in ``dump/rank{r}.safetensors``."""
    dump.mkdir(parents=True, exist_ok=True)
    return torchrun(nproc, WORKER, run_dir, dump, *overrides, extra_env=extra_env)


def train_records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir) if "event" not in r and "loss" in r}
