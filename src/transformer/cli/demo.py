"""``transformer toy``: train a tiny Transformer to copy or reverse random sequences, the
quickest check that the model learns. (``demo``, its old name, is a hidden alias: the name
belongs to ``configs/demo.yaml`` and ``runs/demo``, the Multi30k model of ``make run``.)"""
from __future__ import annotations

import argparse
import time

DESCRIPTION = """\
Train a tiny Transformer (2+2 layers, d_model 64) on a synthetic task: copy, or reverse, a
random sequence of numbers. No data is read or written; it prints the held-out exact match
and three examples, and exits 0 when it gets at least 99% of the held-out sequences right (at
most --steps updates; it stops early at 100%). Not the Multi30k demo model (configs/demo.yaml,
trained by make run)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    _arguments(sub.add_parser("toy", description=DESCRIPTION, help="train a tiny model on a synthetic copy/reverse "
                                                                   "task: a quick check that training works"))
    _arguments(sub.add_parser("demo", description=DESCRIPTION))  # the old name, not listed


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", choices=["copy", "reverse"], default="reverse", help="default: %(default)s")
    p.add_argument("--steps", type=int, default=800,
                   help="most training steps; it stops at 100%% held-out accuracy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..decode import greedy_search
    from ..train.synthetic import make_batch, train_synthetic
    from ._options import check_count

    check_count(args, "steps")
    start = time.perf_counter()
    model, acc = train_synthetic(args.task, steps=args.steps, seed=args.seed)
    print(f"{args.task}: held-out exact match {acc:.2%} after {time.perf_counter() - start:.0f}s")
    sample = make_batch(args.task, 3, 16, 5, 12, torch.Generator().manual_seed(123))
    for src, hyp in zip(sample.src.tolist(), greedy_search(model.eval(), sample.src)):
        show = lambda ids: " ".join(str(i) for i in ids if i > 3)  # noqa: E731
        print(f"  input  {show(src)}\n  output {show(hyp[0].tokens)}")
    return 0 if acc >= 0.99 else 1
