"""``transformer demo``: train a tiny Transformer to copy or reverse random sequences."""
from __future__ import annotations

import argparse
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a tiny model on a synthetic copy/reverse task (about a minute)")
    p.add_argument("--task", choices=["copy", "reverse"], default="reverse")
    p.add_argument("--steps", type=int, default=800, help="most training steps (stops at 100%% accuracy)")
    p.add_argument("--seed", type=int, default=0)
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
