"""Training checkpoints: the weights plus everything needed to continue exactly (optimizer,
step, RNG states, data position), written atomically as one directory.

A checkpoint directory (``checkpoints/step-NNNNNNN/``, see :mod:`transformer.run.layout`)
is written under a temporary name and renamed when complete, so a crash at any moment
leaves either the whole checkpoint or none of it; an old one is renamed away before it is
deleted, so no ``step-*`` directory is ever half-deleted. ``metrics.jsonl`` is appended a
line at a time, and a resume removes its torn last line (:func:`repair_metrics`).

``state.pt`` holds only tensors and plain Python data, and is read with
``torch.load(weights_only=True)``: a checkpoint cannot run code when it is opened.
"""
from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UserError
from ..model import Transformer
from ..run.files import RecordingWriter, atomic_dir, atomic_write
from ..run.layout import CKPT_DIR, STATE, WEIGHTS, checkpoint_dirs, discard
from ..run.weights import write_weights_file


def save_checkpoint(run_dir: Path, model: Transformer, state: dict[str, Any], step: int,
                    keep_last: int, extra: dict[str, str] | None = None) -> Path:
    """Write checkpoints/step-NNNNNNN/ atomically and delete all but the newest ``keep_last``."""
    root = Path(run_dir) / CKPT_DIR

    def fill(tmp: Path) -> None:
        write_weights_file(model, tmp / WEIGHTS, {"step": str(step), **(extra or {})})
        save_state(state, tmp / STATE)

    final = atomic_dir(root / f"step-{step:07d}", fill, make_room=discard)  # the same step saved again: replaced
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        discard(old)
    for stale in [*root.glob(".step-*"), *root.glob(".old-*")]:  # leftovers of a crash
        shutil.rmtree(stale, ignore_errors=True)
    return final


def save_state(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` that fails with the OSError of a full disk (read-only filesystem, quota),
    not torch's ``RuntimeError: unexpected pos``, which does not say what went wrong."""
    with open(path, "wb") as f:
        out = RecordingWriter(f)
        try:
            torch.save(state, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random number generator training draws from (dropout, data noise), as tensors
    and plain data (numpy's key array as a tensor), so that it loads with weights_only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, gauss = rng["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys  # older runs stored the numpy array
    np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, gauss))
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def _numpy_array_globals() -> list:
    """What an older run's state.pt needs beyond plain data: numpy's RNG key array, which
    pickles as an ndarray. Only these constructors are allowed, never arbitrary code."""
    core = getattr(np, "_core", None) or np.core
    names = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        names.append(dtypes.UInt32DType)
    return names


class UnsafeCheckpoint(UserError):
    """A state.pt that would need arbitrary code to load: refused, not skipped."""


def load_training_state(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / STATE
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e) or "Unsupported operand" in str(e):
            found = str(e).split("GLOBAL ", 1)[-1].split(" ", 1)[0] if "GLOBAL " in str(e) else "unknown objects"
            raise UnsafeCheckpoint(f"{path}: refused: it asks to build {found}, which is not training state and "
                                   "could run code; this file was not written by transformer. Delete "
                                   f"{Path(ckpt)} if you do not trust it") from None
        raise UserError(f"{path}: cannot read the training state (UnpicklingError); "
                        "delete this checkpoint directory to resume from the previous one") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user problem
        raise UserError(f"{path}: cannot read the training state ({type(e).__name__}); "
                        "delete this checkpoint directory to resume from the previous one") from None


def repair_metrics(path: Path, step: int) -> tuple[int, bool]:
    """Make ``metrics.jsonl`` the history of the run that continues from ``step``: remove a
    torn last line (a crash in mid-write) and the records of later steps, which the resumed
    run repeats (training resumes exactly, so it logs them again). Returns
    ``(records removed, whether the last line was torn)``; the file is rewritten atomically."""
    path = Path(path)
    if not path.is_file():
        return 0, False
    lines = path.read_bytes().split(b"\n")
    torn = lines.pop() != b""  # the bytes after the last newline
    keep, dropped = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] > step:
            dropped += 1
            continue
        keep.append(line)
    if dropped or torn:
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(b"".join(line + b"\n" for line in keep)))
    return dropped, torn
