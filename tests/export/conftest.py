"""Fixtures for the export tests: one small trained run directory per session (built once,
by the real ``transformer train`` command, shared by the xdist workers), tiny random models,
and a helper that runs ``transformer.cli.main`` in-process.

The run is a toy model trained for 300 steps on a synthetic word-for-word "language pair"
(a few seconds on one core): its outputs depend on the input and end with EOS, so searches
can be compared token for token. (The same pattern as tests/cli/conftest.py, kept separate
so that the two folders do not depend on each other.)
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

TRANSFORMER = str(Path(sys.executable).with_name("transformer"))

from tiny_corpus import SRC_WORDS, TGT_OF, write_corpus  # noqa: E402,F401  (shared by the test folders)


@dataclass
class Trained:
    run: Path  # the run directory (best.safetensors, subwords.model, checkpoints/)
    corpus: dict[str, Path]

    def sources(self, n: int = 20) -> list[str]:
        """The first ``n`` validation source sentences."""
        return self.corpus["valid_src"].read_text(encoding="utf-8").splitlines()[:n]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Trained:
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by all workers
    base = root / "export-trained"
    with open(root / "export-trained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker trains, the others wait and reuse
        corpus = write_corpus(base / "corpus")
        run = base / "run"
        if not (base / "done").exists():
            config = base / "tiny.yaml"
            config.write_text(yaml.safe_dump({
                "dataset": "files", **{k: str(v) for k, v in corpus.items()},
                "vocab_size": 120, "model": {"preset": "toy"}, "max_tokens": 512,
                "lr_schedule": "inverse_sqrt", "peak_lr": 0.005, "warmup": 40,
                "max_steps": 300, "eval_every": 300, "save_every": 300, "keep_last": 1, "log_every": 100,
                "progress": False, "threads": 1, "precision": "fp32",
            }), encoding="utf-8")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            done = subprocess.run([TRANSFORMER, "train", "--config", str(config), "--out", str(run)],
                                  capture_output=True, text=True, env=env, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            (base / "done").write_text("ok")
    return Trained(run, corpus)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """``cli(*argv)`` -> Result(code, out, err) from ``transformer.cli.main``."""
    from transformer.cli import main

    def run(*argv) -> Result:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse (--help, usage errors)
            code = e.code if isinstance(e.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def assert_one_line_error(r: Result, *mentions: str) -> None:
    """Exit code 2 and exactly one stderr line ``transformer export: error: ...`` naming ``mentions``."""
    assert r.code == 2, (r.code, r.err)
    assert "Traceback" not in r.err + r.out
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("transformer export: error: "), lines[0]
    for m in mentions:
        assert str(m) in lines[0], (m, lines[0])


@pytest.fixture
def one_line_error():
    return assert_one_line_error
