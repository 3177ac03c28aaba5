"""Model weights on disk: safetensors files that carry their model config in the metadata,
so a file alone rebuilds its model. Nothing here unpickles anything."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ..model.config import ModelConfig
from ..errors import UserError
from ..model import Transformer, build_model
from .files import atomic_write
from .layout import WEIGHTS, not_a_run_remedy, resolve_weights

FORMAT = "transformer-v1"


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


def weights_metadata(model: Transformer, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"model_config": json.dumps(model.cfg.to_dict()), "format": FORMAT, **(extra or {})}


def write_weights_file(model: Transformer, path: str | Path, extra: dict[str, str] | None = None) -> None:
    """Write the weights to ``path`` directly (inside a folder that is itself written atomically)."""
    save_file(unique_state_dict(model), str(path), metadata=weights_metadata(model, extra))


def save_weights(model: Transformer, path: str | Path, extra: dict[str, str] | None = None) -> None:
    """Write weights and the model config (in the safetensors metadata) atomically."""
    tensors, meta = unique_state_dict(model), weights_metadata(model, extra)
    atomic_write(Path(path), lambda tmp: save_file(tensors, tmp, metadata=meta))


def read_weights(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, str]]:
    """Read a weights file: (config, tensors, metadata). Clear errors for bad files."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: weights file not found")
    meta = _metadata(path)
    cfg = _config_of(path, meta)
    try:
        _refuse_oversized(path, cfg)
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None
    return cfg, tensors, meta


# The position tables a model computes when it is built (sinusoids, rotary angles) are not in its
# file; a model whose tables are larger than its weights by more than this is refused as well.
TABLE_SLACK = 1 << 22


def fewest_parameters(cfg: ModelConfig) -> int:
    """A lower bound on the parameters of the model ``cfg`` describes, from the parts every
    variant has: the embedding and, in each layer of one stack, the attention's W^Q and W^O
    and the feed-forward network's two matrices."""
    d = cfg.d_model
    return cfg.vocab_size * d + cfg.n_layers * (2 * d * d + 2 * d * cfg.d_ff)


def _refuse_oversized(path: Path, cfg: ModelConfig) -> None:
    """A weights file whose metadata declares a model larger than the tensors it holds is
    refused before the model is built: built first, a forged config (a vocabulary of 10**9)
    took all the memory before any shape was compared. Reads the file's header alone."""
    with safe_open(str(path), framework="pt") as f:
        held = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    declared = fewest_parameters(cfg)
    table = cfg.max_len * (cfg.d_head if cfg.positions == "rope" else cfg.d_model)
    if declared > held or table > held + TABLE_SLACK:
        raise UserError(f"{path}: its metadata describes a model of at least {declared:,} parameters (and position "
                        f"tables of {table:,} numbers), but the file holds {held:,} numbers; not built (the "
                        "metadata was damaged or edited)")


def read_model_config(path: str | Path) -> ModelConfig:
    """The config of the model a path stands for (as :func:`load_model` resolves it), from
    the weights file's metadata alone: which kind of model it is, before loading it."""
    weights = resolve_weights(path)
    return _config_of(weights, _metadata(weights))


def read_metadata(path: str | Path) -> dict[str, str]:
    """A weights file's metadata alone (its header: no tensor is read)."""
    return _metadata(Path(path))


def _metadata(path: Path) -> dict[str, str]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        if path.suffix != ".safetensors":  # a text file, a PyTorch pickle (.pt, .bin): no weights of ours
            raise UserError(f"{path}: not a safetensors weights file ({e}); give a run directory, or the "
                            ".safetensors weights in one") from None
        raise UserError(f"{path}: not a readable safetensors file, truncated or corrupt ({e})") from None


def _config_of(path: Path, meta: dict[str, str]) -> ModelConfig:
    if "model_config" not in meta:
        raise UserError(f"{path}: no model config in the file's metadata, so not weights that transformer wrote; "
                        f"{not_a_run_remedy(path.parent)}")
    try:
        return ModelConfig.from_dict(json.loads(meta["model_config"]))
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: bad model config in metadata ({e})") from None


def load_weights_into(model: Transformer, tensors: dict[str, torch.Tensor], source: str | Path) -> None:
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


def refuse_non_finite(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """A one-line UserError naming the file and the first tensor that holds a NaN or an
    infinity: such weights decode nothing (every score they give is NaN), and a file that
    holds them was damaged or written by a training run that diverged. A tensor's sum is
    finite when all of it is (NaN and infinities carry through a sum), and summing is one
    read of the weights, where ``isfinite(t).all()`` took 5 to 40 times as long on the CPU
    (benchmarks/decode/README.md); only a sum that is not (or overflowed) is looked into."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t.sum())) and (
                bad := int(t.numel() - torch.isfinite(t).sum())):
            raise UserError(f"{path}: the weights are not finite: {name} holds {bad:,} NaN or infinite "
                            f"value{'s' if bad != 1 else ''} of {t.numel():,}; use another checkpoint (the file is "
                            "damaged, or its training diverged)")


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, dict[str, str]]:
    """A model from a weights file, a checkpoint directory or a run directory (in a run
    directory: averaged, else best, else the latest checkpoint), in eval mode, with the
    file's metadata and its ``path``; refused in one line when a weight is not finite."""
    weights = resolve_weights(path)
    cfg, tensors, meta = read_weights(weights)
    refuse_non_finite(tensors, weights)
    model = build_model(cfg)
    load_weights_into(model, tensors, weights)
    return model.to(device).eval(), {**meta, "path": str(weights)}


@torch.no_grad()
def average_checkpoints(paths: list[Path], out: str | Path) -> Path:
    """Average the weights of several checkpoints or weights files (one config) into ``out``."""
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
            elif not torch.equal(v, acc[k]):  # integer buffers: the same in every checkpoint
                raise UserError(f"{p}: {k} differs from {paths[0]}; cannot average")
    model = build_model(cfg0)
    load_weights_into(model, {k: (v / len(paths)).float() if v.is_floating_point() else v for k, v in acc.items()},
                      paths[0])
    save_weights(model, out, {"averaged_from": ",".join(p.name for p in paths)})
    return Path(out)
