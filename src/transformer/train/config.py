"""Training configuration: a frozen dataclass loaded from YAML with ``--set key=value`` overrides."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import PRESETS, ModelConfig
from ..errors import UserError

LR_SCHEDULES = ("noam", "inverse_sqrt")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class TrainConfig:
    # ---- data ----
    dataset: str = "multi30k"  # "multi30k", or "files" (train_src/train_tgt/valid_src/valid_tgt)
    src_lang: str = "en"
    tgt_lang: str = "de"
    data_dir: str | None = None  # where multi30k/ lives (else $TRANSFORMER_DATA, else a cache)
    train_src: str | None = None
    train_tgt: str | None = None
    valid_src: str | None = None
    valid_tgt: str | None = None
    train_limit: int = 0  # use only the first N training pairs (0 = all)
    valid_limit: int = 0  # BLEU on the first N validation pairs (0 = all)
    vocab_size: int = 8000  # joint sentencepiece BPE
    lowercase: bool = False  # the subword model lower-cases all text (as published Multi30k systems were trained)
    subword_dropout: float = 0.0  # BPE-dropout: each epoch re-segments the training text, skipping merges with this probability
    # ---- model: a preset plus overrides of any ModelConfig field ----
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    # ---- optimisation ----
    max_tokens: int = 4096  # tokens per micro-batch (padded, the larger of source / target)
    accum_steps: int = 1  # micro-batches per update
    max_steps: int = 10000
    max_epochs: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock limit on training (0 = none); checkpoints then stops
    lr_schedule: str = "noam"  # noam: lr_scale * d_model^-0.5 * min(...); inverse_sqrt: peak_lr
    lr_scale: float = 1.0
    peak_lr: float = 1e-3
    warmup: int = 4000
    cooldown: int = 0  # the last N updates before max_steps decay the learning rate linearly to 0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no clipping
    weight_decay: float = 0.0
    precision: str = "auto"  # auto: bf16 autocast where the CPU/GPU supports it, else fp32
    seed: int = 1
    threads: int = 0  # torch CPU threads (0 = torch's default)
    # ---- evaluation, checkpoints, logging ----
    eval_every: int = 1000
    eval_bleu: bool = True  # greedy BLEU on the validation set at each evaluation
    patience: int = 0  # stop after this many evaluations without a better BLEU (0 = never)
    save_every: int = 1000
    keep_last: int = 10
    average_last: int = 0  # at the end, average the last K checkpoints into averaged.safetensors
    log_every: int = 100
    tensorboard: bool = False
    progress: bool = True
    max_bad_steps: int = 20  # consecutive non-finite steps before the run stops

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise UserError(f"config: {msg}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))  # 1 is a fine float
            elif not _has_type(value, f.type):
                raise UserError(f"config: {f.name} must be {_TYPE_NAMES.get(f.type, f.type)}, got {value!r}")
        need(self.seed >= 0, f"seed must be non-negative, got {self.seed}")
        for name in ("max_epochs", "max_minutes", "clip_norm", "weight_decay", "patience", "average_last",
                     "threads", "train_limit", "valid_limit", "lr_scale", "peak_lr"):
            need(getattr(self, name) >= 0, f"{name} must not be negative, got {getattr(self, name)}")

        need(self.dataset in ("multi30k", "files"), f"dataset must be 'multi30k' or 'files', not {self.dataset!r}")
        if self.dataset == "files":
            need(bool(self.train_src and self.train_tgt),
                 "dataset 'files' needs train_src and train_tgt (and valid_src/valid_tgt for validation)")
        need(self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}")
        need(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}")
        for name in ("max_tokens", "accum_steps", "max_steps", "warmup", "eval_every", "save_every",
                     "keep_last", "log_every", "vocab_size", "max_bad_steps"):
            need(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        need(0 <= self.cooldown <= self.max_steps, f"cooldown must be in [0, max_steps], got {self.cooldown}")
        need(0.0 <= self.label_smoothing < 1.0, "label_smoothing must be in [0, 1)")
        need(0.0 <= self.subword_dropout < 1.0, f"subword_dropout must be in [0, 1), got {self.subword_dropout}")
        need(isinstance(self.model, dict) and self.model.get("preset", "tiny") in PRESETS,
             f"model.preset must be one of {sorted(PRESETS)}")

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The ModelConfig for a vocabulary of ``vocab_size`` subwords."""
        overrides = {k: v for k, v in self.model.items() if k != "preset"}
        try:
            return ModelConfig.preset(self.model.get("preset", "tiny"), vocab_size=vocab_size, **overrides)
        except (TypeError, ValueError) as e:
            raise UserError(f"config: model: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "str | None": "a string", "dict[str, Any]": "a mapping"}


def _has_type(value: Any, annotation: str) -> bool:
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, float)
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "str | None":
        return value is None or isinstance(value, str)
    if annotation == "dict[str, Any]":
        return isinstance(value, dict)
    return True


def _parse_value(text: str) -> Any:
    """YAML scalar semantics for --set values: 3 -> int, 1e-3 -> float, true -> bool, x -> str."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # yaml reads 1e-3 as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings; ``model.d_model=256`` reaches into the model section."""
    data = {**data, "model": dict(data.get("model") or {"preset": "tiny"})}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    model_known = {f.name for f in dataclasses.fields(ModelConfig)} | {"preset"}
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected key=value, e.g. --set max_steps=200")
        key, _, raw = item.partition("=")
        key = key.strip()
        value = _parse_value(raw)
        if key.startswith("model."):
            sub = key[len("model."):]
            if sub not in model_known:
                raise UserError(f"--set {key}: unknown model option; choose from {sorted(model_known)}")
            data["model"][sub] = value
        elif key in known and key != "model":
            data[key] = value
        else:
            raise UserError(f"--set {key}: unknown option; choose from {sorted(known - {'model'})} or model.*")
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a mapping of option: value")
        known = {f.name for f in dataclasses.fields(TrainConfig)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"{path}: unknown option(s) {unknown}")
    data = apply_overrides(data, overrides or [])
    try:
        return TrainConfig(**data)
    except TypeError as e:
        raise UserError(f"config: {e}") from None
