"""Training configuration: a frozen dataclass loaded from YAML with ``--set key=value`` overrides.

:class:`TrainConfig` is the union of five parts, one concern each, every one a frozen
dataclass that checks its own fields: :class:`DataConfig` (the corpus or text, the tokenizer,
earlier work to start from), :class:`OptimConfig` (batches, optimizer, regularisation,
arithmetic), :class:`ScheduleConfig` (learning rate and limits), :class:`CheckpointConfig`
(evaluation and the weights kept) and :class:`LoggingConfig`; plus the ``model`` and
``decoding`` sections. The YAML keys are flat (``max_steps: 1500``), as they always were;
``cfg.schedule`` and the like give a part back.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..model.config import PRESETS, ModelConfig
from ..decode.decoding_config import FIELDS as DECODING_FIELDS
from ..decode.decoding_config import DecodingConfig
from ..errors import UserError, shown
from ..frozen import TYPE_NAMES, Frozen, has_type, part, unknown_keys, whole_numbers_as_floats
from ..run.layout import CONFIG, DuplicateKey, load_yaml, read_yaml

LR_SCHEDULES = ("noam", "inverse_sqrt", "cosine")
OPTIMIZERS = ("adam", "adamw")
TOKENIZERS = ("bpe", "chars")
TEXT_DATASETS = ("text", "tinyshakespeare", "multi30k-mono")  # a decoder-only language model trains on these
TRAINING_PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # autocast (the decoding choices: decode/decoding_config.py)
PATH_KEYS = ("data_dir", "train_src", "train_tgt", "valid_src", "valid_tgt", "text_files", "init_from", "subwords_from",
             "embedding_init")  # the keys naming a file or folder
MODEL_KEYS = {f.name for f in dataclasses.fields(ModelConfig)} | {"preset"}  # the model section's


def resumable(default: Any) -> Any:
    """A field that a resumed run may change (limits, logging, evaluation, decoding): it does
    not alter the trajectory of the updates already made."""
    return field(default=default, metadata={"resumable": True})


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(f"config: {msg}")


def _names(part: type) -> tuple[str, ...]:
    """The fields a part declares itself."""
    return tuple(part.__annotations__)


def _typed(config, names) -> None:
    """Each of ``names``: 1 is a fine float; any other value of the wrong type, one line."""
    whole_numbers_as_floats(config, names)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in names and not has_type(value, f.type):
            raise UserError(f"config: {f.name} must be {TYPE_NAMES.get(f.type, f.type)}, got {shown(value)}")


def _not_negative(config, *names: str) -> None:
    for name in names:  # nan and inf too: a learning rate of inf turns every weight into nan
        value = getattr(config, name)
        _need(math.isfinite(value) and value >= 0, f"{name} must be a finite number >= 0, got {value}")


def _positive(config, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        _need(math.isfinite(value) and value > 0, f"{name} must be a finite number > 0, got {value}")


@dataclass(frozen=True)
class DataConfig:
    """What the model learns from: a translation corpus or a language model's text, and the tokenizer."""
    # ---- data ----
    dataset: str = "multi30k"  # translation: "multi30k" or "files"; a language model: "text", "tinyshakespeare" or "multi30k-mono" (tgt_lang's side)
    src_lang: str = "en"  # the source language: multi30k's file names (en, de, fr, cs); dataset files: a label
    tgt_lang: str = "de"  # the target language (as src_lang); multi30k-mono: the language modelled
    data_dir: str | None = resumable(None)  # where multi30k/ lives (else $TRANSFORMER_DATA, else a cache)
    train_src: str | None = None  # dataset files: source sentences, one a line (UTF-8, .gz allowed); without train_tgt, a TSV of source<TAB>target lines
    train_tgt: str | None = None  # dataset files: the target sentences, line N the translation of train_src's line N
    valid_src: str | None = None  # dataset files: validation source sentences (with valid_tgt), or a TSV when train_src is one
    valid_tgt: str | None = None  # dataset files: the validation target sentences (with valid_src)
    valid_size: float = 0.01  # dataset files without valid_src: hold out this many training pairs (>= 1), or this fraction (< 1; at most 1,000 pairs), drawn with seed; 0 = no validation
    train_limit: int = 0  # use only the first N training pairs (0 = all)
    valid_limit: int = resumable(0)  # BLEU on the first N validation pairs (0 = all)
    vocab_size: int = 8000  # the size of the joint sentencepiece BPE vocabulary learned at the first start (not used with init_from / subwords_from: theirs is reused)
    # ---- a language model's text (dataset text / tinyshakespeare) ----
    text_files: list[str] = field(default_factory=list)  # dataset text: UTF-8 files (.gz allowed) read as one stream, in order
    tokenizer: str = "bpe"  # "bpe": sentencepiece of vocab_size learned on the training text; "chars": nanoGPT's (not used with init_from: the source run's tokenizer is copied)
    valid_fraction: float = 0.1  # the last part of the text validates (nanoGPT: 10%); 0 = no validation
    lowercase: bool = False  # the subword model lower-cases all text (as published Multi30k systems were trained)
    # ---- a new run built on earlier work (a resumed run does not read these again) ----
    init_from: str | None = None  # fine-tune: a run directory or weights file whose weights, vocabulary (a translation run's subwords.model; a language model's tokenizer files) and architecture start this run (a fresh optimizer and schedule); the model section: left out, or agreeing
    subwords_from: str | None = None  # reuse a subword model (a run directory, or a sentencepiece .model file) instead of learning one, with its own size (vocab_size is not used); lowercase must match it
    embedding_init: str | None = None  # word vectors (word2vec text or binary, GloVe text) that start the embedding rows of the pieces they hold (see data/word_vectors.py)

    def __post_init__(self) -> None:
        if isinstance(self.text_files, str):  # text_files: one.txt
            object.__setattr__(self, "text_files", [self.text_files])
        _typed(self, _names(DataConfig))
        for key in PATH_KEYS:  # ~/data/train.en in a YAML file, where no shell expands it
            value = getattr(self, key)
            if isinstance(value, list):
                object.__setattr__(self, key, [os.path.expanduser(p) for p in value])
            elif value:
                object.__setattr__(self, key, os.path.expanduser(value))
        _not_negative(self, "train_limit", "valid_limit")
        _positive(self, "vocab_size")
        datasets = ("multi30k", "files", *TEXT_DATASETS)
        _need(self.dataset in datasets, f"dataset must be one of {datasets}, not {shown(self.dataset)}")
        self._check_files()
        self._check_reuse()
        if self.dataset == "text":
            _need(bool(self.text_files), "dataset 'text' needs text_files: [one or more UTF-8 files]")
        else:
            _need(not self.text_files, f"text_files apply to dataset text, not {shown(self.dataset)}; set dataset=text "
                                       f"to train on them")
        _need(self.tokenizer in TOKENIZERS, f"tokenizer must be one of {TOKENIZERS}, not {shown(self.tokenizer)}")
        _need(0.0 <= self.valid_fraction < 1.0, f"valid_fraction must be in [0, 1), got {self.valid_fraction}")

    def _check_files(self) -> None:
        """dataset files: train_src + train_tgt (+ valid_src + valid_tgt), or TSV files."""
        files = ("train_src", "train_tgt", "valid_src", "valid_tgt")
        if self.dataset != "files":
            given = [k for k in files if getattr(self, k) is not None]
            _need(not given, f"{', '.join(given)} apply to dataset files, not {shown(self.dataset)}")
            return
        _need(bool(self.train_src), "dataset files needs train_src (and train_tgt, or train_src as a TSV file of "
                                    "source<TAB>target lines)")
        if self.train_tgt is not None:
            _need(self.valid_src is None or self.valid_tgt is not None,
                  "valid_src is given without valid_tgt; give both (line N of one the translation of line N "
                  "of the other), or neither to hold out valid_size training pairs")
        else:
            _need(self.valid_tgt is None, "valid_tgt is given but train_src is a TSV (no train_tgt); give "
                                          "valid_src alone as a TSV too, or give train_tgt")
        _need(self.valid_tgt is None or self.valid_src is not None, "valid_tgt is given without valid_src; give both")
        _need(self.valid_size >= 0 and (self.valid_size < 1 or self.valid_size.is_integer()),
              f"valid_size must be a whole number of pairs (>= 1) or a fraction in [0, 1), got {self.valid_size}")

    def _check_reuse(self) -> None:
        given = [k for k in ("subwords_from", "embedding_init") if getattr(self, k)]
        _need(not (given and self.is_language_model),
              f"{', '.join(given)} apply to translation (dataset multi30k or files), not {shown(self.dataset)}")
        _need(not (self.init_from and self.embedding_init),
              "init_from and embedding_init both set the embeddings; give one (a fine-tuned run keeps its own)")

    @property
    def is_language_model(self) -> bool:
        """Whether this config trains a decoder-only language model on text (else translation)."""
        return self.dataset in TEXT_DATASETS


@dataclass(frozen=True)
class OptimConfig:
    """How each update is made: batches, the optimizer, regularisation, arithmetic."""
    # ---- optimisation ----
    max_tokens: int = 4096  # tokens per micro-batch (padded, the larger of source / target)
    batch_size: int = 12  # a language model's micro-batch: windows of the context length
    context: int = 0  # a language model's window in tokens; 0 = model.max_len, the longest its positions allow
    accum_steps: int = resumable(1)  # micro-batches per update (a run resumed on other ranks keeps its batch)
    optimizer: str = "adam"  # adam: the paper's (eps 1e-9, weight_decay as L2); adamw: decoupled, 2-D weights only
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's (beta1, beta2); the paper: 0.9, 0.98
    label_smoothing: float | None = None  # None: 0.1 for translation (the paper), 0 for a language model
    dropout_ramp: int = 0  # the first N updates move the model's dropout linearly from dropout_start to model.dropout
    dropout_start: float = 0.1  # the dropout of update 1 when dropout_ramp > 0
    clip_norm: float = 0.0  # clip the gradients' global L2 norm to this value (0 = no clipping)
    weight_decay: float = 0.0  # adam: an L2 penalty added to the gradients; adamw: decoupled decay of 2-D weights
    precision: str = "auto"  # auto: on a CPU with native bf16 (AVX512-BF16, AMX) bf16 autocast or fp32, whichever a few updates of the recipe measured faster on its first run (kept in your cache; train/auto_precision.py); on a GPU bf16 where native, else fp16 autocast (loss-scaled); else fp32 (a CPU without native bf16 emulates it, ~20x slower)
    compile_loss: bool = resumable(False)  # CPU: the loss's two passes as kernels generated by torch.compile
    compile: bool = resumable(False)  # language models: the forward pass, loss and backward as one graph compiled by torch.compile
    seed: int = 1  # seeds the initial weights, the batch order and dropout
    threads: int = resumable(0)  # torch CPU threads (0 = torch's default)

    def __post_init__(self) -> None:
        if isinstance(self.betas, (list, tuple)) and all(_is_number(b) for b in self.betas):
            object.__setattr__(self, "betas", [float(b) for b in self.betas])
        _typed(self, _names(OptimConfig))
        _need(self.seed >= 0, f"seed must be non-negative, got {self.seed}")
        _not_negative(self, "clip_norm", "weight_decay", "threads", "context", "dropout_ramp")
        _positive(self, "max_tokens", "batch_size", "accum_steps")
        _need(self.optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}, not {shown(self.optimizer)}")
        _need(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas),
               f"betas must be two numbers in [0, 1), got {self.betas}")
        _need(self.precision in TRAINING_PRECISIONS, f"precision must be one of {TRAINING_PRECISIONS}")
        _need(self.label_smoothing is None or 0.0 <= self.label_smoothing < 1.0, "label_smoothing must be in [0, 1)")
        _need(0.0 <= self.dropout_start < 1.0, f"dropout_start must be in [0, 1), got {self.dropout_start}")


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning rate over the updates, and when training stops."""
    # ---- schedule and limits ----
    lr_schedule: str = "noam"  # noam: lr_scale * d_model^-0.5 * min(...); inverse_sqrt, cosine: peak_lr
    lr_scale: float = 1.0  # noam: a factor on the paper's rate
    peak_lr: float = 1e-3  # inverse_sqrt, cosine: the rate reached at the end of warmup
    warmup: int = 4000  # updates over which the learning rate rises linearly from 0 (the paper: 4000)
    min_lr: float = 0.0  # cosine: the rate reached at lr_decay_steps (nanoGPT's min_lr)
    lr_decay_steps: int = 0  # cosine: the update where it reaches min_lr (nanoGPT's lr_decay_iters); 0 = max_steps
    cooldown: int = resumable(0)  # the last N updates before max_steps decay the learning rate linearly to 0
    max_steps: int = resumable(10000)  # stop after this many updates; a finished run resumed at or past it trains nothing (raise it to train further)
    max_epochs: int = resumable(0)  # stop after this many passes over the training data (0 = no limit)
    max_minutes: float = resumable(0.0)  # wall-clock limit on training (0 = none); checkpoints then stops

    def __post_init__(self) -> None:
        _typed(self, _names(ScheduleConfig))
        _not_negative(self, "max_epochs", "max_minutes", "lr_scale", "peak_lr", "min_lr", "lr_decay_steps")
        _positive(self, "max_steps", "warmup")
        _need(self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}")
        _need(0 <= self.cooldown <= self.max_steps, f"cooldown must be in [0, max_steps], got {self.cooldown}")


@dataclass(frozen=True)
class CheckpointConfig:
    """Evaluation, checkpoints and the weights kept."""
    # ---- evaluation and checkpoints ----
    eval_every: int = resumable(1000)  # validate every N updates (and at the end)
    eval_bleu: bool = resumable(True)  # greedy BLEU on the validation set at each evaluation
    patience: int = resumable(0)  # stop after this many evaluations without a better BLEU (0 = never)
    save_every: int = resumable(1000)  # write a checkpoint every N updates (and at the end)
    keep_last: int = resumable(10)  # checkpoints kept in checkpoints/; older ones are deleted
    average_last: int = resumable(0)  # at the end, average the last K checkpoints into averaged.safetensors
    max_bad_steps: int = resumable(20)  # consecutive non-finite steps before the run stops (found at a read-back: log_every)

    def __post_init__(self) -> None:
        _typed(self, _names(CheckpointConfig))
        _not_negative(self, "patience", "average_last")
        _positive(self, "eval_every", "save_every", "keep_last", "max_bad_steps")
        _need(self.average_last <= self.keep_last, f"average_last {self.average_last} averages more checkpoints "
                                                   f"than keep_last {self.keep_last} keeps; raise keep_last to "
                                                   f"{self.average_last} or lower average_last")


@dataclass(frozen=True)
class LoggingConfig:
    """What a run reports while it trains."""
    # ---- logging ----
    log_every: int = resumable(100)  # read the loop's figures back from the device and append a training record to metrics.jsonl every N updates
    tensorboard: bool = resumable(False)  # also write the records as TensorBoard scalars in tensorboard/ (needs the tensorboard package)
    progress: bool = resumable(True)  # show a progress bar on the terminal

    def __post_init__(self) -> None:
        _typed(self, _names(LoggingConfig))
        _positive(self, "log_every")


# (the fields come in the order data, optimisation, schedule, checkpoints, logging, then the
# model and decoding sections: dataclasses collect them from the last base class to the first)
@dataclass(frozen=True)
class TrainConfig(LoggingConfig, CheckpointConfig, ScheduleConfig, OptimConfig, DataConfig, Frozen):
    """Every training option, the union of its parts (:class:`DataConfig`,
    :class:`OptimConfig`, :class:`ScheduleConfig`, :class:`CheckpointConfig`,
    :class:`LoggingConfig`) plus the model and decoding sections; flat, as YAML and
    ``--set`` name them. ``docs`` of each field is its comment. Fields made with
    :func:`resumable` may change when a run is resumed; a change of any other is refused."""

    # ---- model: a preset plus overrides of any ModelConfig field ----
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})  # e.g. {preset: tiny, dropout: 0.1}: the model keys below
    # ---- how the trained model decodes (translate, evaluate, serve; see decode/decoding_config.py) ----
    decoding: dict[str, Any] = field(default_factory=dict, metadata={"resumable": True})  # e.g. {beam: 5, alpha: 1.0}: the recipe's tuned settings

    def __post_init__(self) -> None:
        if self.label_smoothing is None:
            object.__setattr__(self, "label_smoothing", 0.0 if self.is_language_model else 0.1)
        for kind in (DataConfig, OptimConfig, ScheduleConfig, CheckpointConfig, LoggingConfig):
            kind.__post_init__(self)  # each part checks its own fields
        _typed(self, ("model", "decoding"))
        _need(isinstance(self.model, dict) and self.model.get("preset", "tiny") in PRESETS,
              f"model.preset must be one of {sorted(PRESETS)}")
        unknown = sorted(set(self.model) - MODEL_KEYS, key=str)
        _need(not unknown, f"model: unknown key(s) {unknown}; choose from {sorted(MODEL_KEYS)}")
        kind = self.model.get("kind", PRESETS[self.model.get("preset", "tiny")].get("kind", "encoder-decoder"))
        # a fine-tune without a model section takes its source's model (checked in train/reuse.py)
        source_model = bool(self.init_from) and not {"kind", "preset"} & set(self.model)
        lm_presets = sorted(k for k, v in PRESETS.items() if v.get("kind") == "decoder-only")
        if self.is_language_model:
            _need(source_model or kind == "decoder-only", f"dataset {shown(self.dataset)} trains a language model: "
                                                           f"choose a decoder-only model.preset ({', '.join(lm_presets)})")
            _need(not self.max_epochs, "max_epochs does not apply to a language model (random windows have no "
                                       "epochs); use max_steps")
            max_len = math.inf if source_model else self.model_config(vocab_size=max(self.vocab_size, 8)).max_len
            _need(self.context <= max_len, f"context {self.context} is longer than the positions allow "
                                           f"(model.max_len {max_len}); lower context or raise model.max_len")
        else:
            _need(not self.compile, "compile applies to language models (windows of one fixed shape); translation "
                                    "batches change shape every update, so leave it false (compile_loss compiles "
                                    "the translation loss)")
            _need(kind == "encoder-decoder", f"dataset {shown(self.dataset)} is a translation corpus: a decoder-only "
                                             f"model.preset trains on dataset {', '.join(TEXT_DATASETS)}")
        if self.patience:  # else early stopping would silently never come
            validates = (self.valid_fraction > 0 if self.is_language_model
                         else self.dataset != "files" or bool(self.valid_src) or self.valid_size > 0)
            _need(validates, f"patience {self.patience} counts evaluations without a better score, but nothing "
                             f"validates (valid_{'fraction' if self.is_language_model else 'size'} 0); "
                             "set patience: 0 or keep a validation part")
            _need(self.is_language_model or self.eval_bleu, f"patience {self.patience} counts evaluations without a "
                                                            "better BLEU; it needs eval_bleu: true")
        try:
            DecodingConfig.from_dict(self.decoding)
        except (ValueError, TypeError) as e:  # "beam must be ...", or "decoding: unknown key(s) ..."
            raise UserError(f"config: {'' if str(e).startswith('decoding') else 'decoding.'}{e}") from None

    data = part(DataConfig)
    optim = part(OptimConfig)
    schedule = part(ScheduleConfig)
    checkpoints = part(CheckpointConfig)
    logging = part(LoggingConfig)

    def model_config(self, vocab_size: int, **extra: Any) -> ModelConfig:
        """The ModelConfig for a vocabulary of ``vocab_size`` subwords."""
        overrides = {**{k: v for k, v in self.model.items() if k != "preset"}, **extra}
        try:
            return ModelConfig.preset(self.model.get("preset", "tiny"), vocab_size=vocab_size, **overrides)
        except (TypeError, ValueError) as e:
            raise UserError(f"config: model: {e}") from None

    @classmethod
    def resumable_fields(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if f.metadata.get("resumable")}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse_value(text: str) -> Any:
    """YAML scalar semantics for --set values: 3 -> int, 1e-3 -> float, true -> bool, x -> str
    (a value YAML refuses, aliases that expand too far among them, stays the text given)."""
    try:
        value = load_yaml(text)
    except (yaml.YAMLError, DuplicateKey, RecursionError):
        return text
    if isinstance(value, str):  # yaml reads 1e-3 as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings; ``model.d_model=256`` reaches into the model section."""
    # Without a model section a run gets the tiny preset; a fine-tune (init_from) its source's model.
    fine_tune = data.get("init_from") or any(k.strip() == "init_from" and v.strip()
                                             for k, _, v in (o.partition("=") for o in overrides))
    model = data.get("model") or ({} if fine_tune else {"preset": "tiny"})
    data = {**data, "model": dict(model), "decoding": dict(data.get("decoding") or {})}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    # the sections whose keys --set reaches with a dot: model.d_model=256, decoding.beam=5
    sections = {"model": MODEL_KEYS, "decoding": set(DECODING_FIELDS)}
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected key=value, e.g. --set max_steps=200")
        key, _, raw = item.partition("=")
        key = key.strip()
        value = _parse_value(raw)
        section, dot, sub = key.partition(".")
        if dot and section in sections:
            if sub not in sections[section]:
                raise UserError(f"--set {key}: unknown {section} option; choose from {sorted(sections[section])}")
            data[section][sub] = value
        elif key in known and key not in sections:
            data[key] = value
        else:
            hint = ""
            if key in sections:  # --set model=...: one key of it, not the whole section
                hint = f" (set one key of the section, e.g. --set {key}.{sorted(sections[key])[0]}=...)"
            raise UserError(f"--set {key}: unknown option{hint}; choose from {sorted(known - set(sections))} "
                            "or model.* or decoding.*")
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():  # a run directory, given as fairseq's --restore-file or HF's resume_from_checkpoint are
            run = (path / CONFIG).is_file()
            resume = f" (to resume the run there: --config {path / CONFIG} --out {path})" if run else ""
            raise UserError(f"{path}: a folder, not a config file; give a YAML config such as "
                            f"configs/demo.yaml{resume}")
        if not path.is_file():
            raise UserError(f"{path}: config file not found")
        data = read_yaml(path, "correct it") or {}
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a mapping of option: value")
        for section, example in (("model", "{preset: base, dropout: 0.1}"), ("decoding", "{beam: 5, alpha: 1.0}")):
            if data.get(section) is not None and not isinstance(data[section], dict):
                raise UserError(f"{path}: {section} must be a mapping of option: value, e.g. {section}: {example}; "
                                f"got {shown(data[section])}")
        unknown = unknown_keys(TrainConfig, data)
        if unknown:
            raise UserError(f"{path}: unknown option(s) {unknown}")
    data = apply_overrides(data, overrides or [])
    try:
        return TrainConfig(**data)
    except TypeError as e:
        raise UserError(f"config: {e}") from None
