"""A word-for-word "language pair" for tests that train a real (toy) run: each target word
is a fixed spelling of its source word, so a toy model learns something within a few
hundred steps and its outputs depend on its inputs. Importable from every test folder
(pytest puts tests/ on the path for tests/conftest.py).

Beside it, what such tests share: a folder built once per session for all xdist workers
(:func:`build_once`), a toy run trained by the real ``transformer train`` command
(:func:`train_tiny_run`), a training process stopped by SIGTERM after its first checkpoint
(:func:`sigterm_after_first_checkpoint`), the toy model's config (:func:`toy_overrides`) and a
run's metrics (:func:`read_metrics`)."""
from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SRC_WORDS = ("red blue green small big dog cat bird man woman child runs sits eats sees plays "
             "with near under the a ball tree house car water park street").split()
TGT_OF = {w: "x" + w[::-1] for w in SRC_WORDS}
TRANSFORMER = str(Path(sys.executable).with_name("transformer"))


def write_corpus(folder: Path, n_train: int = 400, n_valid: int = 20, seed: int = 0,
                 extra: Sequence[str] = ()) -> dict[str, Path]:
    """Write train/valid .src/.tgt files (one sentence a line) and return their paths;
    ``extra`` lines end both training files as they are (a pair of equal sentences)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        sents = [[rng.choice(SRC_WORDS) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        more = list(extra) if split == "train" else []
        for side, text in (("src", [" ".join(s) for s in sents] + more),
                           ("tgt", [" ".join(TGT_OF[w] for w in s) for s in sents] + more)):
            path = folder / f"{split}.{side}"
            path.write_text("".join(t + "\n" for t in text), encoding="utf-8")
            paths[f"{split}_{side}"] = path
    return paths


def corpus_files(folder: Path) -> dict[str, Path]:
    """The paths :func:`write_corpus` returns for ``folder``."""
    return {f"{split}_{side}": folder / f"{split}.{side}" for split in ("train", "valid") for side in ("src", "tgt")}


def toy_overrides(corpus: dict[str, Path]) -> list[str]:
    """A toy model on ``corpus`` as ``key=value`` overrides: a few milliseconds per step on
    one core, one log line per step, evaluated and saved every 1,000 steps and at the end."""
    return [
        "dataset=files",
        f"train_src={corpus['train_src']}", f"train_tgt={corpus['train_tgt']}",
        f"valid_src={corpus['valid_src']}", f"valid_tgt={corpus['valid_tgt']}",
        "vocab_size=120", "model.preset=toy", "max_tokens=256",
        "lr_schedule=inverse_sqrt", "peak_lr=0.002", "warmup=8",
        "progress=false", "threads=1", "log_every=1", "eval_every=1000", "save_every=1000",
    ]


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of RUN_DIR/metrics.jsonl."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def process_env() -> dict[str, str]:
    """The environment of a training process a test starts: one thread, unbuffered output."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# ---- built once per session, shared by the xdist workers ---------------------------------
def shared_dir(tmp_path_factory) -> Path:
    """A folder shared by all xdist workers of this session."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def build_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` of :func:`shared_dir`, filled by ``build(folder)`` in the first
    worker to ask: under a file lock, so the others wait and then reuse it. A build that
    failed part way is started again from an empty folder."""
    base = shared_dir(tmp_path_factory) / name
    with open(f"{base}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "done").exists():
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir(parents=True)
            build(base)
            (base / "done").write_text("ok")
    return base


def train_tiny_run(tmp_path_factory, name: str, **config) -> tuple[Path, dict[str, Path], Path]:
    """Train one toy run per test session with the real ``transformer train`` command, shared
    by the xdist workers (:func:`build_once`). ``config`` overrides the defaults below.
    Returns (run directory, corpus paths, config file)."""
    import yaml

    def train(base: Path) -> None:
        corpus = write_corpus(base / "corpus")
        (base / "tiny.yaml").write_text(yaml.safe_dump({
            "dataset": "files", **{k: str(v) for k, v in corpus.items()},
            "vocab_size": 120, "model": {"preset": "toy"}, "max_tokens": 512,
            "lr_schedule": "inverse_sqrt", "peak_lr": 0.005, "warmup": 40,
            "max_steps": 300, "eval_every": 300, "save_every": 300, "keep_last": 1, "log_every": 100,
            "progress": False, "threads": 1, "precision": "fp32", **config,
        }), encoding="utf-8")
        done = subprocess.run([TRANSFORMER, "train", "--config", str(base / "tiny.yaml"), "--out", str(base / "run")],
                              capture_output=True, text=True, env=process_env(), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    base = build_once(tmp_path_factory, f"{name}-trained", train)
    return base / "run", corpus_files(base / "corpus"), base / "tiny.yaml"


# ---- a training process stopped as a cluster scheduler stops it --------------------------
def sigterm_after_first_checkpoint(cmd: list[str], run: Path, wait: float, stop: float) -> tuple[int, str, str, float]:
    """Start the training command ``cmd`` (which writes ``run``), send it SIGTERM as soon as
    its first checkpoint is complete (at most ``wait`` seconds from the start), and give it
    ``stop`` seconds to end. Returns (exit code, stdout, stderr, seconds from SIGTERM to the
    end). Whatever still runs when the test ends is killed, with its process group (torchrun's
    ranks too)."""
    from transformer.run import checkpoint_dirs

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + wait
        while not checkpoint_dirs(run):
            assert proc.poll() is None, f"training ended early: {proc.communicate()}"
            assert time.monotonic() < deadline, f"no checkpoint after {wait:.0f} s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=stop)
        return proc.returncode, out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
