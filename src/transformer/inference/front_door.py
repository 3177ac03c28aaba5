"""What the two front doors share: a run opened for decoding.

:class:`~transformer.inference.translator.Translator` and :class:`~transformer.inference.generator.Generator`
differ in their search and in how text becomes ids; everything else is this one base:

    settings    the defaults, then the ``decoding`` section of the run's config.yaml, then
                the caller's options (:func:`run_decoding`), checked before the weights load
    weights     :func:`open_model`: on the settings' device (``auto``: a CUDA GPU when there
                is one, :func:`decoding_device`), refused with one line when the run is the
                other kind of model
    vocabulary  :func:`vocabulary_fits`: a tokenizer trained here numbers exactly the model's
                rows, an imported one (Marian, Hugging Face) at most as many
    precision   the model converted once (:func:`~transformer.decode.precision.decoding_model`);
                ``requested_precision`` keeps what was asked (``auto``), ``decoding.precision``
                what it resolved to
    the step    :meth:`FrontDoor.search_step`, for each batch: the one place that decides
                whether a search runs eagerly or through the compiled step
                (:mod:`transformer.compiled`, kept in the run's folder of the user's cache)
    length      :meth:`FrontDoor.fit_length`: ids longer than the model takes are cut, with a
                warning or counted in ``truncated``; the subclass says which end it keeps
"""
from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Self

import torch
from torch import nn

from .. import compiled, hardware
from ..decode.decoding_config import GPU_MAX_TOKENS, MAX_TOKENS, DecodingConfig
from ..decode.eager_step import EagerStep, is_translation
from ..decode.precision import decoding_device, decoding_model, uses_int8_gemm
from ..errors import UserError
from ..model import LanguageModel, Transformer
from ..run import CONFIG, load_model, read_run_config, run_file, run_root
from .allocator import keep_freed_memory


# compile="auto" builds a step for a generation of at least this many new tokens (steps: a
# step's saving hardly depends on the batch). Measured on 2 cores with the step that
# torch.compile built in every process (benchmarks/lm/README.md): compiling cost 47-95 s and
# saved 1.9-4.3 ms a step, so it paid after 17,000-30,000 steps.
AUTO_MIN_STEPS = 32768
# A translator decodes a batch of more decoder rows (sentences x beam) than this eagerly: the
# compiled step saves a step's fixed costs, which matter less the larger the batch, and beyond
# about this many rows the eager step was as fast or faster (benchmarks/decode/README.md).
MAX_COMPILED_ROWS = 64


def run_decoding(path: str | Path, options: dict | None = None) -> DecodingConfig:
    """The decoding settings for a model path: the defaults, then the ``decoding`` section of
    its run's config.yaml, then ``options`` (field: value; from the command line, named
    ``--field``). Checked before anything big is loaded: a bad value is a one-line error."""
    run = read_run_config(path).get("decoding") or {}
    where = run_file(path, CONFIG)  # a section can only have come from there
    if not isinstance(run, dict):
        raise UserError(f"{where}: decoding must be a mapping of setting: value")
    try:
        base = DecodingConfig.from_dict(run, where=f"{where}: decoding")
    except (ValueError, TypeError) as e:
        raise UserError(f"{where}: decoding: {e}") from None
    try:
        return base.replace(**(options or {}))
    except ValueError as e:  # the message starts with the field's name: give it its option's spelling
        name, _, rest = str(e).partition(" ")
        raise UserError(f"--{name.replace('_', '-')} {rest}") from None


def given(options: dict) -> dict:
    """The options a caller set: None stands for "the run's own setting"."""
    return {k: v for k, v in options.items() if v is not None}


def open_model(path: str | Path, decoding: DecodingConfig, *, language_model: bool) -> nn.Module:
    """The model of the run (or weights file) at ``path`` on ``decoding.device``
    (:func:`decoding_device`); a one-line error when it is a translation model where a
    language model is wanted, or the reverse."""
    model, _ = load_model(path, decoding_device(decoding))
    if model.cfg.decoder_only != language_model:
        raise UserError(f"{path}: a translation model; generate needs a language model (use translate)"
                        if language_model else
                        f"{path}: a language model; translate needs a translation model (use generate)")
    return model


def vocabulary_fits(tokens: int, rows: int, *, imported: bool) -> bool:
    """Whether a tokenizer of ``tokens`` ids belongs with a model of ``rows`` embedding rows:
    one trained here numbers exactly as many; an imported one may number fewer (Qwen pads its
    embedding; Hugging Face reads a piece missing from a Marian vocab.json from the
    sentencepiece model), never more."""
    return tokens <= rows if imported else tokens == rows


def refuse_misfit(decoding: DecodingConfig, cfg) -> None:
    """A one-line UserError for settings the model cannot decode with: a translation beam
    larger than the target vocabulary (there are never that many hypotheses to keep; a beam of
    10**9 took all the memory before anything was decoded)."""
    vocab = cfg.target_vocab_size
    if not cfg.decoder_only and decoding.beam > vocab:
        raise UserError(f"beam {decoding.beam} is larger than the model's target vocabulary ({vocab} tokens), "
                        f"the most hypotheses a beam can hold; give --beam {vocab} or less (a beam of 4 to 10 is usual)")


class FrontDoor:
    """The base of :class:`~transformer.inference.translator.Translator` and
    :class:`~transformer.inference.generator.Generator`: the model converted for decoding, its
    settings, the count of inputs cut to fit, and the compiled step.

    A subclass gives :meth:`search_kind` (which step its search runs), ``gpu_max_tokens``
    (its batches' size on a GPU, when ``max_tokens`` is not set) and, for
    :meth:`fit_length`, ``too_long`` (the warning: ``{n}`` ids, ``{room}`` kept) and ``keep_last``
    (True: an input keeps its last ``max_len - 1`` ids, else its first).
    """

    too_long: str
    keep_last: bool
    gpu_max_tokens = MAX_TOKENS  # a batch's source tokens on a GPU when max_tokens is not set

    def __init__(self, model: nn.Module, decoding: DecodingConfig | None, warn: bool) -> None:
        decoding = decoding or DecodingConfig()
        decoding = self.sized(decoding.replace(device=decoding_device(decoding, model)))  # auto: where the model is
        self.requested_precision = decoding.precision  # before auto is resolved
        self.model, self.decoding = decoding_model(model, decoding, warn=False)
        # warned here, not by decoding_model, so that the warning points at whoever built the front door
        if warn and (note := hardware.slow_precision_warning(decoding.precision, decoding.device)):
            warnings.warn(note, stacklevel=3)
        self.device = torch.device(self.decoding.device)
        if self.device.type == "cpu":  # (a process that decodes keeps what it frees for its next step)
            keep_freed_memory()
        self.warn = warn
        self.truncated = 0  # inputs cut to fit, over this object's life
        refuse_misfit(self.decoding, self.model.cfg)

    def with_decoding(self, **changes) -> Self:
        """The same front door (the same model, already converted) with other search settings."""
        if {"precision", "device"} & set(changes):
            name = type(self).__name__
            raise ValueError(f"with_decoding: precision and device need a new {name} (the model is converted)")
        other = copy.copy(self)
        other.decoding, other.truncated = self.sized(self.decoding.replace(**changes)), 0
        refuse_misfit(other.decoding, self.model.cfg)
        return other

    @classmethod
    def sized(cls, decoding: DecodingConfig) -> DecodingConfig:
        """``decoding`` (its device resolved) with its batch size set for that device when it
        has none (:data:`MAX_TOKENS`)."""
        if decoding.max_tokens is not None:
            return decoding
        gpu = torch.device(decoding.device).type == "cuda"
        return decoding.replace(max_tokens=cls.gpu_max_tokens if gpu else MAX_TOKENS)

    def search_step(self, rows: int):
        """The step the search of a batch of ``rows`` decoder rows (sentences x beam, or
        prompts) runs: the compiled one where :meth:`compiles` says so, else the model's own
        ``decode`` on its growing cache."""
        group, logprobs, _ = self.search_kind()
        if self.compiles(rows)[0]:
            return compiled.step(self.model, group, logprobs)
        return EagerStep(self.model, logprobs)

    def compiles(self, rows: int | None = None) -> tuple[bool, bool]:
        """Whether a batch of ``rows`` decoder rows (default: one input's) runs through the
        compiled step, and whether that step has to be built first (tens of seconds to
        minutes; kept in the user's cache). The one place this is decided:

        - ``decoding.compile``: ``on`` builds the step if it is missing; ``off``; ``auto`` runs
          it when it is built already, or a generation's ``max_new_tokens`` are enough to pay
          for building it (:data:`AUTO_MIN_STEPS`); on a GPU ``auto`` is eager (measured
          there, on an H200, the compiled step was the slower: 17.5 s against 13.5 s for
          test2016 in bf16, benchmarks/gpu/README.md).
        - Eagerly whatever it says: ``TRANSFORMER_COMPILE=off``; an ensemble; an int8 model
          whose layers multiply with fbgemm's int8 GEMM
          (:func:`~transformer.decode.precision.uses_int8_gemm`, a warning with ``on``); a
          translation batch of more than :data:`MAX_COMPILED_ROWS` rows (no slower there).
        """
        group, logprobs, new_tokens = self.search_kind()
        setting, model = self.decoding.compile, self.model
        if setting == "off" or compiled.switched_off() or not isinstance(model, (Transformer, LanguageModel)):
            return False, False  # (an ensemble, or a stand-in with a model's interface, decodes eagerly)
        if setting == "auto" and self.device.type != "cpu":
            return False, False
        if uses_int8_gemm(model):  # faster eagerly: the compiled step would hold float32 weights
            if setting == "on":
                warnings.warn("int8 on this CPU multiplies with fbgemm's int8 GEMM, which a compiled step cannot "
                              "call (it would hold the weights dequantised to float32, and ran slower); decoding "
                              "eagerly", compiled.CompiledStepWarning, stacklevel=3)
            return False, False
        if is_translation(model) and (group if rows is None else rows) > MAX_COMPILED_ROWS:
            return False, False
        built = compiled.is_built(model, group, logprobs)
        return setting == "on" or new_tokens >= AUTO_MIN_STEPS or built, not built

    def prepare(self) -> None:
        """Load, or build, the compiled step now (see :meth:`compiles`), not in the first batch."""
        group, logprobs, _ = self.search_kind()
        compiled.step(self.model, group, logprobs).prepare()

    def search_kind(self) -> tuple[int, bool, int]:
        """What the search needs of its step: (rows per input: 1, or the beam size; whether it
        reads log-probabilities rather than logits; the new tokens of a generation, 0 for a
        translation)."""
        raise NotImplementedError

    def keep_compiled_steps(self, path: str | Path) -> None:
        """Keep the compiled steps in the user's cache folder of the run ``path`` belongs to
        (none: they stay in memory)."""
        if (root := run_root(path)) is not None:
            compiled.keep_for_run(self.model, root)

    def fit_length(self, ids: list[int]) -> list[int]:
        """``ids`` cut to the ``max_len - 1`` the model takes (one position is left: for EOS,
        or the first new token), counted in ``truncated`` and, with ``warn``, warned about
        (the warning points at the caller of the public method that encodes)."""
        room = self.model.cfg.max_len - 1
        if len(ids) <= room:
            return ids
        self.truncated += 1
        if self.warn:
            warnings.warn(self.too_long.format(n=len(ids), room=room), stacklevel=4)
        return ids[-room:] if self.keep_last else ids[:room]
