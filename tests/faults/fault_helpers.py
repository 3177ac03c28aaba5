"""Helpers for the fault tests: the console script, its environment, and a check that
nothing in a run directory is corrupt."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from tiny_corpus import TRANSFORMER  # noqa: F401  (for the tests)
from tiny_corpus import process_env as subprocess_env  # noqa: F401

from transformer.train.train_config import TrainConfig


def check_run_dir(run: Path, finished: bool = False) -> None:
    """Every file a reader relies on is whole: each visible checkpoint loads completely,
    config.yaml, subwords.model and best.safetensors read, and every metrics.jsonl line
    parses (a torn last line is allowed only in a run that was killed, not a finished one)."""
    from transformer.data import Subwords
    from transformer.run import checkpoint_dirs, read_weights
    from transformer.train.checkpoint import load_training_state

    root = run / "checkpoints"
    if root.is_dir():
        complete = set(checkpoint_dirs(run))
        for d in root.iterdir():
            if not d.name.startswith("step-"):
                continue  # a temporary (.step-*, .old-*) or a set-aside corrupt-step-*: ignored by readers
            assert d in complete, f"{d.name}: a checkpoint directory that is not complete"
            _, _, meta = read_weights(d / "model.safetensors")
            assert meta["step"] == str(int(d.name.split("-")[1]))
            assert load_training_state(d)["step"] == int(meta["step"])
    if (run / "config.yaml").exists():
        TrainConfig(**yaml.safe_load((run / "config.yaml").read_text()))
    if (run / "subwords.model").exists():
        Subwords.load(run / "subwords.model")
    for name in ("best.safetensors", "averaged.safetensors"):
        if (run / name).exists():
            read_weights(run / name)
    if (run / "metrics.jsonl").exists():
        lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
        tail = lines.pop()
        assert not (finished and tail), f"torn last line in a finished run: {tail!r}"
        for line in lines:
            assert isinstance(json.loads(line), dict)

