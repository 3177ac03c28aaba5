"""A toy language-model run for the service tests (a module of its own: test files and the
conftest import it by name): a character model (two layers, two heads, 32 wide, context
48) trained for 100 steps on made-up sentences, once per session and shared by the xdist
workers under a file lock, as tests/lm trains its own."""
from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path

WORDS = "the a cat dog sat ran on under mat log and then quickly slowly".split()
CONTEXT = 48  # the model's max_len: a prompt and 40 new tokens pass it, so windows slide


def make_text(n_lines: int = 120, seed: int = 0) -> str:
    """Short made-up sentences, one a line: enough structure for the loss to fall fast."""
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + ".\n" for _ in range(n_lines))


def train_tiny_lm(tmp_path_factory) -> Path:
    """The run directory (chars.json, best.safetensors, config.yaml) of the toy model."""
    from transformer.train.train_config import load_config
    from transformer.train.trainer import Trainer

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by all workers
    base = root / "serve-lm-trained"
    with open(root / "serve-lm-trained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = base / "run"
        if not (base / "done").exists():
            base.mkdir(parents=True, exist_ok=True)
            text = base / "tiny.txt"
            text.write_text(make_text(), encoding="utf-8")
            cfg = load_config(None, [
                "dataset=text", f"text_files=[{text}]", "tokenizer=chars", "model.preset=nanogpt-char",
                "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_layers=2", f"model.max_len={CONTEXT}",
                "batch_size=4", "optimizer=adamw", "weight_decay=0.1", "lr_schedule=cosine", "peak_lr=0.01",
                "min_lr=0.001", "warmup=2", "clip_norm=1.0", "precision=fp32", "progress=false", "threads=1",
                "log_every=50", "max_steps=100", "eval_every=100", "save_every=100"])
            Trainer(cfg, run, log=lambda *a: None).train()
            (base / "done").write_text("ok")
    return run


def lm_test_client(run: Path, **settings):
    """The language-model app in-process, in Starlette's TestClient (enter it: the batcher
    runs while it is open); ``settings`` are ServeConfig fields."""
    from starlette.testclient import TestClient

    from transformer.inference.generator import Generator
    from transformer.serve import ServeConfig, create_app

    generator = Generator.from_pretrained(run, warn=False)
    return TestClient(create_app(generator, ServeConfig(**settings), model_name="toy-lm"))
