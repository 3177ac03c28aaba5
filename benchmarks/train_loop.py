"""The training loop as a user runs it, on two or more source trees side by side.

Each round trains each tree's code through ``Trainer`` (the loop, the batches, the logging,
everything ``transformer train`` does but the command line) for ``--steps`` updates of a
shipped recipe, each in a fresh process, the trees taking turns; the time per update is read
from the run's own metrics.jsonl (``train_minutes`` between the first record and the last, so
start-up, data preparation and the first updates are left out). The table gives each tree's
median over the rounds and its ratio to the first tree.

    mkdir OLD && git archive OLD_COMMIT src | tar -x -C OLD      # OLD: a new, empty folder
    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/train_loop.py --tree before=OLD/src --tree after=src \
        [--recipe lm --recipe mt] [--rounds 3] [--steps 60] [--set precision=fp32]

Recipes: ``lm`` is configs/shakespeare-char.yaml (nanoGPT's CPU recipe), ``mt`` configs/demo.yaml
(the ``make run`` model on Multi30k); evaluation and checkpoints are pushed past the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"lm": "configs/shakespeare-char.yaml", "mt": "configs/demo.yaml"}
CHILD = """
import json, sys
import torch
from transformer.train.train_config import load_config
from transformer.train.trainer import Trainer
config, out, threads, overrides = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
torch.set_num_threads(threads)
Trainer(load_config(config, overrides), out, log=lambda *a: None).train()
"""


def ms_per_update(run: Path) -> tuple[float, int]:
    """Milliseconds per update between the first training record and the last, and the updates."""
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in recs if "event" not in r and "train_minutes" in r]
    first, last = train[0], train[-1]
    steps = last["step"] - first["step"]
    return (last["train_minutes"] - first["train_minutes"]) * 60e3 / steps, steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a tree's src/ folder")
    ap.add_argument("--recipe", action="append", choices=sorted(RECIPES), help="default: both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--log-every", type=int, default=10, help="the records the time is read from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="more key=value overrides for every run")
    args = ap.parse_args(argv)
    from transformer import hardware

    print(hardware.describe_line(), flush=True)
    trees = [t.split("=", 1) for t in args.tree]
    recipes = args.recipe or sorted(RECIPES)
    times: dict[tuple[str, str], list[float]] = {(r, n): [] for r in recipes for n, _ in trees}
    overrides = [f"max_steps={args.steps}", f"log_every={args.log_every}", "eval_every=100000",
                 "save_every=100000", "progress=false", f"threads={args.threads}", "average_last=0", *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for recipe in recipes:
                for name, src in trees:
                    out = Path(tmp) / f"{recipe}-{name}-{k}"
                    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
                    subprocess.run([sys.executable, "-c", CHILD, str(REPO / RECIPES[recipe]), str(out),
                                    str(args.threads), *overrides], env=env, check=True)
                    ms, steps = ms_per_update(out)
                    times[recipe, name].append(ms)
                    print(f"round {k + 1} {recipe} {name}: {ms:.1f} ms/update over {steps} updates", flush=True)
    print("\n| recipe | tree | ms per update (median) | rounds | vs first |\n|---|---|---|---|---|")
    for recipe in recipes:
        first = statistics.median(times[recipe, trees[0][0]])
        for name, _ in trees:
            med = statistics.median(times[recipe, name])
            print(f"| {recipe} | {name} | {med:.1f} | {len(times[recipe, name])} | {first / med:.3f}x |")


if __name__ == "__main__":
    main()
