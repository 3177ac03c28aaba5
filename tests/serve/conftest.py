"""Fixtures for the service tests: one small trained run directory per session (trained
once by the real ``transformer train`` and shared by the xdist workers under a file lock),
and the real server (``transformer serve`` in a subprocess on a free loopback port).

The run is a toy model trained for 200 steps on a synthetic word-for-word "language pair"
(as in tests/cli), enough for its translations to depend on the input. The language-model
fixtures (``lm_run``, ``lm_server``, ``lm_client``) serve a toy character model (serve_lm.py);
``token_server`` and ``lm_token_server`` are the two wanting a token (``TOKEN``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

TRANSFORMER = str(Path(sys.executable).with_name("transformer"))

from serve_lm import lm_test_client, train_tiny_lm  # noqa: E402
from tiny_corpus import train_tiny_run  # noqa: E402

# Inputs the tests translate: ordinary sentences, one with an unseen word and punctuation.
SENTENCES = [
    "the dog runs", "a small cat sits near the tree", "red ball", "the big man eats",
    "a child plays with the ball", "green bird", "the woman sees a car near the house",
    "blue water", "a cat under the car", "the dog sees the cat", "zebra runs!", "big red house",
]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A trained run directory (subwords.model, best.safetensors, checkpoints)."""
    run, _, _ = train_tiny_run(tmp_path_factory, "serve", max_steps=200, eval_every=200, save_every=200)
    return run


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def translator(run_dir):
    """The reference: the same model loaded in-process, default settings (beam 4)."""
    from transformer.inference.translator import load_translator

    return load_translator(run_dir, beam=4)


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path
    page: str = ""  # the address the start-up line prints (with a token: http://...:PORT/#token=...)
    token: str | None = None  # the token it wants (the fixtures that give it one say it here)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        return request(self.url + path, headers=headers)

    def post(self, path: str, body: object = None, *, data: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict]:
        if data is None:
            data = json.dumps(body).encode()
        return request(self.url + path, data, {"Content-Type": "application/json", **(headers or {})})


def request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 60) -> tuple[int, dict]:
    """(status, parsed JSON body) of a GET (no data) or POST, errors included."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(run_dir: Path, log: Path, *args: str, timeout: float = 90) -> Server:
    """``transformer serve --port 0 ...`` in a subprocess; returns once it answers /health."""
    with open(log, "wb") as out:
        process = subprocess.Popen([TRANSFORMER, "serve", "--model", str(run_dir), "--port", "0", *args],
                                   stdout=out, stderr=subprocess.STDOUT, env=subprocess_env())
    deadline = time.monotonic() + timeout
    url = page = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}:\n{log.read_text()}")
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("transformer serve: http://"):
                page = line.split()[2]
                url = page.split("#")[0].rstrip("/")
        if url:
            try:
                if request(url + "/health", timeout=5)[0] == 200:
                    return Server(url, process, log, page)
            except OSError:
                pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"server did not start in {timeout} s:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def server(run_dir, tmp_path_factory):
    """The real service, with dynamic batching (default settings, beam 4)."""
    s = start_server(run_dir, tmp_path_factory.mktemp("serve") / "server.log",
                     "--max-chars", "600", "--max-texts", "16")
    yield s
    stop_server(s)


TOKEN = "s3cret+/&%=token"  # characters a URL must escape: the printed address still carries it whole


@pytest.fixture(scope="session")
def token_server(run_dir, tmp_path_factory):
    """The real service with ``--token TOKEN``; its ``page`` is the address it printed."""
    s = start_server(run_dir, tmp_path_factory.mktemp("serve-token") / "server.log", "--token", TOKEN)
    s.token = TOKEN
    yield s
    stop_server(s)


@pytest.fixture
def start_another(run_dir, tmp_path):
    """``start_another(*args)``: one more server on the same run with other options, stopped
    at the end of the test."""
    started = []

    def start(*args: str) -> Server:
        started.append(start_server(run_dir, tmp_path / f"server{len(started)}.log", *args))
        return started[-1]

    yield start
    for s in started:
        stop_server(s)


# ---- the language model ----------------------------------------------------------------

@pytest.fixture(scope="session")
def lm_run(tmp_path_factory) -> Path:
    """A trained character language model's run directory (context 48)."""
    return train_tiny_lm(tmp_path_factory)


@pytest.fixture(scope="session")
def lm_server(lm_run, tmp_path_factory):
    """``transformer serve`` on the language model, with dynamic batching."""
    s = start_server(lm_run, tmp_path_factory.mktemp("serve-lm") / "server.log", "--max-chars", "200")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def lm_token_server(lm_run, tmp_path_factory):
    """``transformer serve`` on the language model with ``--token TOKEN``."""
    s = start_server(lm_run, tmp_path_factory.mktemp("serve-lm-token") / "server.log", "--token", TOKEN)
    s.token = TOKEN
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def lm_client(lm_run):
    """The language-model app in-process: prompts up to 200 characters, 300 new tokens."""
    with lm_test_client(lm_run, max_chars=200, new_tokens_limit=300) as client:
        yield client
