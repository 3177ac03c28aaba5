"""``transformer average``: average the weights of the last K checkpoints (as the paper does).
Writing into the run directory (the default, ``averaged.safetensors``), it holds the run's
writer lock (:mod:`transformer.run.lock`) meanwhile: beside a ``train`` or another
``average`` of the run it stops at once with one line naming the other's pid."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the last K checkpoints of a run")
    p.add_argument("--model", required=True, help="run directory")
    p.add_argument("--last", type=int, default=10, help="how many of the newest checkpoints")
    p.add_argument("--out", help="output file (default: RUN_DIR/averaged.safetensors)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError
    from ..run import AVERAGED, average_checkpoints, checkpoint_dirs, lock_run

    run_dir = Path(args.model)
    if args.last < 1:
        raise UserError(f"--last must be at least 1, got {args.last}")
    dirs = checkpoint_dirs(run_dir)[-args.last:]
    if not dirs:
        raise UserError(f"{run_dir}: no checkpoints found under {run_dir / 'checkpoints'}")
    out = Path(args.out) if args.out else run_dir / AVERAGED
    lock = lock_run(run_dir, "transformer command") if out.resolve().parent == run_dir.resolve() else None
    try:
        average_checkpoints(dirs, out)
    finally:
        if lock is not None:
            lock.release()
    print(f"averaged {len(dirs)} checkpoints ({dirs[0].name} .. {dirs[-1].name}) -> {out}")
    return 0
