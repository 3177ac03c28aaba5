"""Checkpoints: safetensors weights plus the full training state, written atomically.

Run directory layout::

    RUN_DIR/config.yaml               the training config
    RUN_DIR/subwords.model            the sentencepiece model (translation preprocesses with it)
    RUN_DIR/metrics.jsonl             one JSON object per log / evaluation line
    RUN_DIR/checkpoints/step-0001000/ model.safetensors + state.pt (optimizer, step, RNG, data position)
    RUN_DIR/best.safetensors          the weights with the best validation BLEU
    RUN_DIR/averaged.safetensors      the average of the last K checkpoints (``transformer average``)

A checkpoint directory is written under a temporary name and renamed when complete, so
a crash at any moment leaves either the whole checkpoint or none of it; an old one is
renamed away before it is deleted, so no ``step-*`` directory is ever half-deleted. Every
other file is replaced atomically (config, best/averaged weights, subwords) or appended a
line at a time (metrics.jsonl, whose torn last line a resume removes, see
:func:`repair_metrics`). :func:`remove_stale_files` clears what a crash leaves behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..config import ModelConfig
from ..errors import UserError
from ..fileio import atomic_write
from ..model import Transformer

WEIGHTS = "model.safetensors"
STATE = "state.pt"
CKPT_DIR = "checkpoints"
PREFERRED = ("averaged.safetensors", "best.safetensors")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared (tied) tensor stored once, ``_orig_mod.`` stripped."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict().items():
        name = name.replace("_orig_mod.", "")
        key = t.data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().cpu()
    return out


def save_weights(model: Transformer, path: Path, extra: dict[str, str] | None = None) -> None:
    """Write weights and the model config (in the safetensors metadata) atomically."""
    meta = {"model_config": json.dumps(model.cfg.to_dict()), "format": "transformer-v1", **(extra or {})}
    tensors = unique_state_dict(model)
    atomic_write(Path(path), lambda tmp: save_file(tensors, tmp, metadata=meta))


def read_weights(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, str]]:
    """Read a weights file: (config, tensors, metadata). Clear errors for bad files."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: weights file not found")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None
    if "model_config" not in meta:
        raise UserError(f"{path}: no model config in the file's metadata; was it written by transformer?")
    try:
        cfg = ModelConfig.from_dict(json.loads(meta["model_config"]))
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: bad model config in metadata ({e})") from None
    return cfg, tensors, meta


def load_weights_into(model: Transformer, tensors: dict[str, torch.Tensor], source: Path) -> None:
    """Copy tensors into ``model``; every parameter must be present with the right shape."""
    own = unique_state_dict(model)
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise UserError(f"{source}: weights do not fit this model (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}); was it written for another config?")
    for name, t in tensors.items():
        if own[name].shape != t.shape:
            raise UserError(f"{source}: {name} has shape {tuple(t.shape)}, the model expects "
                            f"{tuple(own[name].shape)}; the checkpoint belongs to another config")
    with torch.no_grad():
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        for name, t in tensors.items():
            (params.get(name) if name in params else buffers[name]).copy_(t)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, dict[str, str]]:
    """A model from a weights file, a checkpoint directory or a run directory (in a run
    directory: averaged, else best, else the latest checkpoint)."""
    path = Path(path)
    weights = resolve_weights(path)
    cfg, tensors, meta = read_weights(weights)
    model = Transformer(cfg)
    load_weights_into(model, tensors, weights)
    return model.to(device).eval(), {**meta, "path": str(weights)}


def run_file(path: str | Path, name: str) -> Path | None:
    """The file ``name`` (subwords.model, config.yaml) of the run that ``path`` belongs to: a
    run directory, or a weights file or checkpoint in one, as deep as
    checkpoints/step-N/model.safetensors; None when there is none."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    for folder in (root, root.parent, root.parent.parent):
        if (folder / name).is_file():
            return folder / name
    return None


def resolve_weights(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise UserError(f"{path}: no such model (give a run directory or a .safetensors file)")
    if (path / WEIGHTS).is_file():
        return path / WEIGHTS
    for name in PREFERRED:
        if (path / name).is_file():
            return path / name
    latest = latest_checkpoint(path)
    if latest is None:
        raise UserError(f"{path}: no weights found (no averaged/best.safetensors, no checkpoints/)")
    return latest / WEIGHTS


# ---- training checkpoints ---------------------------------------------------------------

def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")
            and (p / WEIGHTS).is_file() and (p / STATE).is_file()]
    return sorted(done, key=lambda p: p.name)


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def save_checkpoint(run_dir: Path, model: Transformer, state: dict[str, Any], step: int,
                    keep_last: int, extra: dict[str, str] | None = None) -> Path:
    """Write checkpoints/step-NNNNNNN/ atomically (a temporary directory renamed when
    complete) and delete all but the newest ``keep_last``."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:07d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:07d}.", dir=root))
    try:
        save_file(unique_state_dict(model), str(tmp / WEIGHTS),
                  metadata={"model_config": json.dumps(model.cfg.to_dict()), "format": "transformer-v1",
                            "step": str(step), **(extra or {})})
        torch.save(state, tmp / STATE)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # the same step saved again (e.g. a resumed run that stops at once)
            _discard(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        _discard(old)
    for stale in [*root.glob(".step-*"), *root.glob(".old-*")]:  # leftovers of a crash
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _discard(path: Path) -> None:
    """Delete a checkpoint directory: first renamed out of the ``step-*`` namespace (atomic),
    then removed, so a crash midway never leaves a half-deleted checkpoint that looks whole."""
    trash = path.with_name(f".old-{path.name}")
    try:
        if trash.exists():
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(path, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a power cut, not only a crash)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def set_aside(ckpt: Path) -> Path:
    """Move an unreadable checkpoint to ``checkpoints/corrupt-step-*`` (kept for inspection,
    out of the way of resume, translation and keep_last)."""
    target = ckpt.with_name(f"corrupt-{ckpt.name}")
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    os.replace(ckpt, target)
    return target


# Temporary names a crash can leave in a run directory (atomic_write, plots, _prepare).
STALE_PATTERNS = (".config.yaml.*.tmp", ".best.safetensors.*.tmp", ".averaged.safetensors.*.tmp",
                  ".metrics.jsonl.*.tmp", "learning_curve.tmp.png", ".prepare.*")


def remove_stale_files(run_dir: Path) -> None:
    """Delete the temporary files and folders a crash left in ``run_dir``."""
    run_dir = Path(run_dir)
    stale = [p for pattern in STALE_PATTERNS for p in run_dir.glob(pattern)]
    root = run_dir / CKPT_DIR
    if root.is_dir():
        stale += [*root.glob(".step-*"), *root.glob(".old-*")]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


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


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random number generator training draws from (dropout, data noise), to save."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def set_rng_state(rng: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def load_training_state(ckpt: Path) -> dict[str, Any]:
    try:
        return torch.load(ckpt / STATE, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user problem
        raise UserError(f"{ckpt / STATE}: cannot read the training state ({type(e).__name__}); "
                        "delete this checkpoint directory to resume from the previous one") from None


@torch.no_grad()
def average_checkpoints(paths: list[Path], out: Path) -> Path:
    """Average the weights of several checkpoints (same config) into ``out``."""
    if not paths:
        raise UserError("no checkpoints to average")
    cfg0, acc, _ = read_weights(paths[0] / WEIGHTS if paths[0].is_dir() else paths[0])
    acc = {k: v.double() if v.is_floating_point() else v for k, v in acc.items()}
    for p in paths[1:]:
        cfg, tensors, _ = read_weights(p / WEIGHTS if p.is_dir() else p)
        if cfg != cfg0 or set(tensors) != set(acc):
            raise UserError(f"{p}: checkpoint has a different config; cannot average")
        for k, v in tensors.items():
            if v.is_floating_point():
                acc[k] += v.double()
            elif not torch.equal(v, acc[k]):  # integer buffers (output_ids): the same in every checkpoint
                raise UserError(f"{p}: {k} differs from {paths[0]}; cannot average")
    model = Transformer(cfg0)
    load_weights_into(model, {k: (v / len(paths)).float() if v.is_floating_point() else v for k, v in acc.items()},
                      paths[0])
    save_weights(model, out, {"averaged_from": ",".join(p.name for p in paths)})
    return out
