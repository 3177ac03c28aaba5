"""``transformer average``: average the weights of the last K checkpoints (as the paper does).
Writing into the run directory (the default, ``averaged.safetensors``), it holds the run's
writer lock (:mod:`transformer.run.lock`) meanwhile: beside a ``train`` or another
``average`` of the run it stops at once with one line naming the other's pid.

Weights alone do not decode: translate, evaluate and generate read the run's config.yaml and
vocabulary beside them (:data:`~transformer.run.layout.DECODING_FILES`). So ``--out`` outside
the run gets a copy of those files beside the weights, and its folder reads as a run
(``--model OUT`` or its folder). A folder where a decoder of OUT would find another run's
files instead (a different config.yaml or vocabulary, there or in the two folders above, as
:func:`~transformer.run.layout.run_file` looks) is refused in one line before anything is
written. ``--out`` naming a folder writes ``averaged.safetensors`` in it."""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("average", help="average the last K checkpoints of a run")
    p.add_argument("--model", required=True, help="run directory")
    p.add_argument("--last", type=int, default=10, help="how many of the newest checkpoints (default: %(default)s)")
    p.add_argument("--out", help="output file, or a folder for averaged.safetensors (a name ending in / is "
                                 "made as one; default: "
                                 "RUN_DIR/averaged.safetensors); outside the run, the run's config.yaml and "
                                 "vocabulary are copied beside it, so that it decodes on its own")
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
    if out.is_dir() or args.out and args.out.endswith(("/", os.sep)):  # newdir/: a folder, made
        out = out / AVERAGED
    copies = _files_to_copy(run_dir, out)  # None: inside the run
    if copies is None:
        _refuse_the_runs_own_file(run_dir, out)
    lock = lock_run(run_dir, "transformer command") if out.resolve().parent == run_dir.resolve() else None
    try:
        _copy(copies or [])
        average_checkpoints(dirs, out)
    except BaseException:
        for _, dst in copies or []:  # a refusal or a failure leaves no copies behind
            with contextlib.suppress(OSError):  # (none made where the folder could not be: a file there)
                dst.unlink(missing_ok=True)
        raise
    finally:
        if lock is not None:
            lock.release()
    beside = ""
    if copies is not None:
        copied = f"; with the run's {', '.join(dst.name for _, dst in copies)} copied beside it" if copies else ""
        beside = f"{copied} (decode with --model {out})"
    which = (f"{len(dirs)} checkpoints ({dirs[0].name} .. {dirs[-1].name})" if len(dirs) > 1
             else f"1 checkpoint ({dirs[0].name})")
    print(f"averaged {which} -> {out}{beside}")
    return 0


def _files_to_copy(run_dir: Path, out: Path) -> list[tuple[Path, Path]] | None:
    """(run's file, its copy beside ``out``) for the decoding files ``out`` would not find
    as they are (None: ``out`` is inside the run, which has them); a one-line UserError when
    a decoder of ``out`` would read another run's."""
    import filecmp

    from ..errors import UserError
    from ..run import DECODING_FILES, run_file, run_root

    home = run_root(out)
    if home is not None and home.resolve() == run_dir.resolve():
        return None  # inside the run: a decoder finds the run's own files
    ours = {name: run_dir / name for name in DECODING_FILES if (run_dir / name).is_file()}
    copies = []
    for name in DECODING_FILES:
        found = run_file(out, name)
        if name in ours:
            target = out.parent / name
            if not target.exists():
                copies.append((ours[name], target))  # shadows any other run's file further up
                continue
            if target.is_file() and filecmp.cmp(target, ours[name], shallow=False):
                continue  # already there (an earlier average into the same folder)
            found = target
        elif found is None:
            continue
        raise UserError(f"--out {out}: a decoder of these weights would read {found}, which is not the "
                        f"{name} of {run_dir}; choose an empty folder (or one inside {run_dir})")
    return copies


def _refuse_the_runs_own_file(run_dir: Path, out: Path) -> None:
    """A one-line UserError when ``out`` (inside the run) names a file the run keeps: its
    config, vocabulary, metrics, curve, best weights or anything in checkpoints/, which the
    average would overwrite (an earlier average is the one file it may replace)."""
    from ..errors import UserError
    from ..run.layout import AVERAGED, BEST, CKPT_DIR, CURVE, DECODING_FILES, METRICS

    root, target = run_dir.resolve(), out.resolve()
    if target in {root / name for name in (*DECODING_FILES, METRICS, CURVE, BEST)} or root / CKPT_DIR in target.parents:
        raise UserError(f"--out {out} is a file of the run {run_dir}, which the average would overwrite; give a new "
                        f"name (the default is {run_dir / AVERAGED})")


def _copy(copies: list[tuple[Path, Path]]) -> None:
    import shutil

    from ..run import atomic_write

    for src, dst in copies:
        atomic_write(dst, lambda tmp, src=src: shutil.copyfile(src, tmp))
