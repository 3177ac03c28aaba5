"""Fixtures for the command-line tests: one small trained run directory per session (built
once, by the real ``transformer train`` command, and shared by the xdist workers), plus a
helper that runs ``transformer.cli.main`` in-process and captures its output.

The run is a toy model trained for 300 steps (a few seconds on one core) on a synthetic
word-for-word "language pair", enough for its translations to depend on the input.
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


@pytest.fixture(scope="session")
def target_words() -> set[str]:
    """Every word of the synthetic target language."""
    return set(TGT_OF.values())


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class Trained:
    run: Path  # the run directory (3 checkpoints: 100, 200, 300; best.safetensors)
    corpus: dict[str, Path]
    config: Path


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Trained:
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by all workers
    base = root / "cli-trained"
    with open(root / "cli-trained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker trains, the others wait and reuse
        corpus = write_corpus(base / "corpus")
        run = base / "run"
        config = base / "tiny.yaml"
        if not (base / "done").exists():
            config.write_text(yaml.safe_dump({
                "dataset": "files", **{k: str(v) for k, v in corpus.items()},
                "vocab_size": 120, "model": {"preset": "toy"}, "max_tokens": 512,
                "lr_schedule": "inverse_sqrt", "peak_lr": 0.005, "warmup": 40,
                "max_steps": 300, "eval_every": 100, "save_every": 100, "keep_last": 3, "log_every": 50,
                "progress": False, "threads": 1, "precision": "fp32",
            }), encoding="utf-8")
            done = subprocess.run([TRANSFORMER, "train", "--config", str(config), "--out", str(run)],
                                  capture_output=True, text=True, env=subprocess_env(), timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            (base / "done").write_text("ok")
    return Trained(run, corpus, config)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli(*argv, stdin=None)`` -> Result(code, out, err) from ``transformer.cli.main``."""
    import io

    from transformer.cli import main

    def run(*argv: str, stdin: str | None = None) -> Result:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse (--help, usage errors)
            code = e.code if isinstance(e.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def assert_one_line_error(r: Result, command: str, *mentions: str) -> None:
    """Exit code 2 and exactly one stderr line ``transformer COMMAND: error: ...`` naming ``mentions``."""
    assert r.code == 2, (r.code, r.err)
    assert "Traceback" not in r.err + r.out
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith(f"transformer {command}: error: "), lines[0]
    for m in mentions:
        assert str(m) in lines[0], (m, lines[0])


@pytest.fixture
def real_cli():
    """``real_cli(*argv, input=None, env=None)`` -> CompletedProcess of the console script
    (a real process: interpreter start-up, signals, stdin/stdout encodings)."""
    def run(*argv, input=None, env=None, timeout=120):
        return subprocess.run([TRANSFORMER, *map(str, argv)], input=input, capture_output=True,
                              text=not isinstance(input, bytes), env={**subprocess_env(), **(env or {})},
                              timeout=timeout)

    return run


@pytest.fixture
def one_line_error():
    return assert_one_line_error
