"""Training checkpoints: the weights plus everything needed to continue exactly (optimizer,
step, RNG states, data position), written atomically as one directory, and read back by a
resumed run (:class:`Checkpoints`, what the training loop holds).

A checkpoint directory (``checkpoints/step-NNNNNNN/``, see :mod:`transformer.run.layout`)
is written under a temporary name and renamed when complete, so a crash at any moment
leaves either the whole checkpoint or none of it; an old one is renamed away before it is
deleted, so no ``step-*`` directory is ever half-deleted. ``metrics.jsonl`` is appended a
line at a time, and a resume removes its torn last line (:func:`repair_metrics`).

``state.pt`` holds only tensors and plain Python data, and is read with
``torch.load(weights_only=True)``: a checkpoint cannot run code when it is opened.
"""
from __future__ import annotations

import contextlib
import json
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UserError
from ..model import Transformer
from ..run import layout, weights
from ..run.files import RecordingWriter, atomic_dir, atomic_write, file_sha256
from ..run.layout import CKPT_DIR, STATE, WEIGHTS, checkpoint_dirs, discard
from ..run.weights import write_weights_file
from .train_config import TrainConfig
from .distributed import Dist, reshard_position
from .prepare import tokenizer_file
from .run_dir import DATA_SHA256


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


class Checkpoints:
    """The checkpoints of the run in ``run_dir`` as the training loop uses them: :meth:`save`
    the weights and a state that continues exactly, :meth:`resume` from the newest that reads.
    Rank 0 alone writes; every rank reads. ``saved_step``: the step of the newest checkpoint
    (None before the first)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, dist: Dist, log: Callable[[str], object]) -> None:
        self.cfg, self.run_dir, self.dist, self.log = cfg, run_dir, dist, log
        self.saved_step: int | None = None
        self.data_sha256 = ""  # the data files' checksums (JSON) each checkpoint records: set by rank 0

    def save(self, model, step: int, state: dict[str, Any]) -> Path:
        """Write a checkpoint of ``model`` at ``step`` with ``state`` and every rank's RNG
        states (every rank must call this: it gathers them). A failure (full disk, unwritable
        folder) is a UserError on every rank; the previous checkpoint is intact."""
        rngs = self.dist.gather(rng_state(self.dist.device))

        def write() -> Path:
            vocab = tokenizer_file(self.cfg, self.run_dir)
            full = {**state, "rng": rngs[0], "rng_per_rank": rngs, "world_size": self.dist.world_size,
                    "accum_steps": self.cfg.accum_steps}
            try:
                return save_checkpoint(self.run_dir, model, full, step, self.cfg.keep_last,
                                       {f"{vocab.stem}_sha256": file_sha256(vocab), DATA_SHA256: self.data_sha256})
            except OSError as e:
                raise UserError(f"{self.run_dir}: could not save a checkpoint ({e.strerror or e}); "
                                "the previous checkpoint is intact") from None

        path = self.dist.on_main(write)
        self.saved_step = step
        return path

    def resume(self, model, restore: Callable[[dict[str, Any]], int]) -> None:
        """Load the newest checkpoint that reads into ``model`` and hand its state to
        ``restore`` (which sets what the loop keeps and returns the step), with the data
        position mapped onto this run's ranks and this rank's RNG states set. One that does
        not read (truncated or corrupt, e.g. damaged after it was written) is moved aside to
        checkpoints/corrupt-* with a warning and the one before it is used; with no older one,
        a clear error. A checkpoint of another config or vocabulary, or one that would run
        code, is refused. Nothing happens in a run without checkpoints."""
        dirs = layout.checkpoint_dirs(self.run_dir)
        for i, path in enumerate(reversed(dirs)):
            try:
                cfg, tensors, meta = weights.read_weights(path / layout.WEIGHTS)
                state = load_training_state(path)
            except UnsafeCheckpoint:
                raise
            except UserError as e:
                if i == len(dirs) - 1:
                    raise
                self.log(f"warning: {e}; resuming from the checkpoint before it")
                if self.dist.is_main:
                    with contextlib.suppress(OSError):  # left in place: the next save of that step replaces it
                        layout.set_aside(path)
                continue
            self._restore(path, model, cfg, tensors, meta, state, restore)
            return

    def _restore(self, path: Path, model, cfg, tensors: dict, meta: dict, state: dict, restore) -> None:
        if cfg != model.cfg:
            raise UserError(f"{path}: checkpoint was written for another model config or vocabulary")
        vocab = tokenizer_file(self.cfg, self.run_dir)
        sha = file_sha256(vocab)
        if meta.get(f"{vocab.stem}_sha256", sha) != sha:
            raise UserError(f"{path}: checkpoint was trained with another {vocab.name}")
        weights.load_weights_into(model, tensors, path)
        try:
            step = restore({**state, "sampler": self._position(state)})
            self._restore_rng(state)
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise UserError(f"{path / layout.STATE}: training state does not fit this run "
                            f"({type(e).__name__}: {e})") from None
        self.saved_step = step
        self.log(f"resumed from {path} (step {step})")

    def _position(self, state: dict) -> dict:
        """The data position, mapped onto this run's number of ranks (see reshard_position)."""
        old_world, world = int(state.get("world_size", 1)), self.dist.world_size
        position = state["sampler"]
        if old_world != world:
            position, skipped = reshard_position(position, old_world, world)
            note = f" ({skipped} batch(es) skipped)" if skipped else ""
            self.log(f"resuming on {world} rank(s) a run saved on {old_world}: epoch {position['epoch']} "
                     f"continues at batch {position['batch_in_epoch'] * world}{note}")
        old_batch = old_world * int(state.get("accum_steps", self.cfg.accum_steps))
        if old_batch != world * self.cfg.accum_steps:
            self.log(f"warning: the global batch changes from {old_batch} to {world * self.cfg.accum_steps} "
                     "micro-batches per update (ranks x accum_steps); keep the product to keep the trajectory")
        return position

    def _restore_rng(self, state: dict) -> None:
        per_rank = state.get("rng_per_rank") or [state["rng"]]
        if self.dist.rank < len(per_rank):
            set_rng_state(per_rank[self.dist.rank], self.dist.device)
        else:  # a rank the saved run did not have
            seed_all(self.cfg.seed + self.dist.rank)

    def repair_metrics(self, step: int) -> None:
        """metrics.jsonl made the history of the run that continues from ``step`` (:func:`repair_metrics`)."""
        dropped, torn = repair_metrics(self.run_dir / layout.METRICS, step)
        if dropped or torn:
            self.log(f"metrics.jsonl: removed {dropped} record(s) of steps after {step}, which this run "
                     "repeats" + (", and a torn last line left by a crash" if torn else ""))


def seed_all(seed: int) -> None:
    """Seed every random number generator training draws from."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
