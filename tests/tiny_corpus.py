"""A word-for-word "language pair" for tests that train a real (toy) run: each target word
is a fixed spelling of its source word, so a toy model learns something within a few
hundred steps and its outputs depend on its inputs. Importable from every test folder
(pytest puts tests/ on the path for tests/conftest.py)."""
from __future__ import annotations

import random
from pathlib import Path

SRC_WORDS = ("red blue green small big dog cat bird man woman child runs sits eats sees plays "
             "with near under the a ball tree house car water park street").split()
TGT_OF = {w: "x" + w[::-1] for w in SRC_WORDS}


def write_corpus(folder: Path, n_train: int = 400, n_valid: int = 20, seed: int = 0) -> dict[str, Path]:
    """Write train/valid .src/.tgt files (one sentence a line) and return their paths."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        sents = [[rng.choice(SRC_WORDS) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        for side, text in (("src", [" ".join(s) for s in sents]),
                           ("tgt", [" ".join(TGT_OF[w] for w in s) for s in sents])):
            path = folder / f"{split}.{side}"
            path.write_text("".join(t + "\n" for t in text), encoding="utf-8")
            paths[f"{split}_{side}"] = path
    return paths


def train_tiny_run(tmp_path_factory, name: str, **config) -> tuple[Path, dict[str, Path], Path]:
    """Train one toy run per test session with the real ``transformer train`` command, shared
    by the xdist workers (the first trains under a file lock, the others wait and reuse it).
    ``config`` overrides the defaults below. Returns (run directory, corpus paths, config file)."""
    import fcntl
    import os
    import subprocess
    import sys

    import yaml

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by all workers
    base = root / f"{name}-trained"
    with open(root / f"{name}-trained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        corpus = write_corpus(base / "corpus")
        run, cfg_path = base / "run", base / "tiny.yaml"
        if not (base / "done").exists():
            cfg_path.write_text(yaml.safe_dump({
                "dataset": "files", **{k: str(v) for k, v in corpus.items()},
                "vocab_size": 120, "model": {"preset": "toy"}, "max_tokens": 512,
                "lr_schedule": "inverse_sqrt", "peak_lr": 0.005, "warmup": 40,
                "max_steps": 300, "eval_every": 300, "save_every": 300, "keep_last": 1, "log_every": 100,
                "progress": False, "threads": 1, "precision": "fp32", **config,
            }), encoding="utf-8")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            done = subprocess.run([str(Path(sys.executable).with_name("transformer")), "train",
                                   "--config", str(cfg_path), "--out", str(run)],
                                  capture_output=True, text=True, env=env, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            (base / "done").write_text("ok")
    return run, corpus, cfg_path
