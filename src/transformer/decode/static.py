"""Compiled decoding on a fixed-shape cache: one decoding step (:mod:`transformer.decode.fixed`),
compiled ahead of time (:mod:`transformer.decode.aot`) and reused for every step of a search
(language-model generation, greedy and beam search); and the one decision whether a search
runs it (:func:`should_compile`, :func:`search_step`).

The cache of ``model.decode`` is rebuilt every step (one position longer, concatenated),
and finished rows leave it. A :class:`~transformer.decode.fixed.FixedKVCache` has its final
size from the start (``capacity`` positions, written in place; finished rows stay, unread,
until a search drops them at a bucket boundary, when half its rows are done), so the only
size that changes from step to step is the number of slots written so far, a symbolic size
of the compiled graph, like the batch, the source length and the capacity: one graph serves
every step of every search of a kind (greedy, or beam search of one beam size). On a CPU,
inductor turns the step into generated C++ loops and matrix products on prepacked weights
(``freezing``: the weights are constants of the graph), which removes most of the
per-operator cost that dominates a small model's step in eager mode.

The eager path is the reference: the compiled step computes the same function, and the
tests compare logits and tokens. Building a step takes tens of seconds to a few minutes;
loading a built one takes a fraction of a second. A model loaded from a run directory keeps
its steps in the run's ``compiled/`` folder (:func:`keep_packages_in`), so a step is built
once and every later command finds it: ``compile="auto"`` (the commands' default) decodes
through a step that is there already, and builds one only for a generation of at least
:data:`AUTO_MIN_STEPS` new tokens; ``compile="on"`` builds what is missing. A model without a
folder builds its steps into a temporary folder, for the process. Measured in
``benchmarks/lm/README.md`` and ``benchmarks/decode/README.md``.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings
import weakref
from functools import cache
from pathlib import Path

import torch
from torch import nn

from ..model import masks
from . import aot
from .steps import FixedShapeStep, GrowingStep, is_translation

COMPILE_CHOICES = ("auto", "on", "off")
# compile="auto" builds a step for a generation of at least this many new tokens (steps: a
# step's saving hardly depends on the batch). Measured on 2 cores with the step that
# torch.compile built in every process (benchmarks/lm/README.md): compiling cost 47-95 s and
# saved 1.9-4.3 ms a step, so it paid after 17,000-30,000 steps.
AUTO_MIN_STEPS = 32768
# A translator decodes a batch of more decoder rows (sentences x beam) than this eagerly: the
# compiled step saves a step's fixed costs, which matter less the larger the batch, and beyond
# about this many rows the eager step was as fast or faster (benchmarks/decode/README.md).
MAX_COMPILED_ROWS = 64

_folders: "weakref.WeakKeyDictionary[nn.Module, Path]" = weakref.WeakKeyDictionary()
_steps: "weakref.WeakKeyDictionary[nn.Module, _Steps]" = weakref.WeakKeyDictionary()


def keep_packages_in(model: nn.Module, folder: str | Path) -> None:
    """Look for the compiled steps of ``model`` in ``folder``, and keep those built there."""
    _folders[model] = Path(folder)


def compilable(model) -> bool:
    """Whether ``model`` has the parts a fixed-shape step is built from (an ensemble, or a
    stand-in with only ``encode`` / ``start_cache`` / ``decode``, decodes eagerly)."""
    return hasattr(model, "decoder_input")


def has_package(model: nn.Module, group: int = 1, logprobs: bool = True) -> bool:
    """Whether the step that a search with ``group`` rows per sentence (1: greedy, else the
    beam size; language models: 1) would use is built already, in memory or on disk."""
    return compilable(model) and _held(model).ready(group, logprobs)


def compiled_step(model: nn.Module, logprobs: bool = False):
    """:func:`~transformer.decode.fixed.translation_step` or
    :func:`~transformer.decode.fixed.generation_step` of ``model``, compiled: the same
    arguments (without the model), the same result. The package for
    each kind of search (the ``group`` it is called with) is loaded or built on first use and
    kept with the model; if the weights change afterwards (in place, as an optimizer does, or
    replaced), or the model switches between training and evaluation, the next call loads or
    builds the package of the new weights.

    ``logprobs``: the step returns :func:`~transformer.decode.common.next_token_logprobs`
    of its logits (float32, PAD and BOS impossible), computed in the same graph: one fused
    pass where eager search casts, normalises and masks the (B, V) logits in three (what
    greedy and beam search read; sampling reads the logits)."""
    return _held(model).step(logprobs)


def prepare(model: nn.Module, group: int = 1, logprobs: bool = True) -> None:
    """Load (or build, if it is missing) the step that :func:`compiled_step` will call with
    ``group`` rows per sentence, now rather than at the first step of a search."""
    _held(model).runner(group, logprobs)


class _Steps:
    """The compiled steps of one model at one weights version."""

    def __init__(self, model: nn.Module, version: tuple) -> None:
        self.owner = weakref.ref(model)  # an entry must not keep its own key (the model) alive
        self.version = version
        self.names: dict[tuple[int, bool], str] = {}
        self.runners: dict[tuple[int, bool], object] = {}
        self.steps: dict[bool, object] = {}

    def name(self, group: int, logprobs: bool) -> str:
        if (group, logprobs) not in self.names:
            self.names[group, logprobs] = aot.package_name(self.owner(), group, logprobs)
        return self.names[group, logprobs]

    def ready(self, group: int, logprobs: bool) -> bool:
        folder = _folders.get(self.owner())
        return (group, logprobs) in self.runners or (
            folder is not None and (folder / self.name(group, logprobs)).is_file())

    def runner(self, group: int, logprobs: bool):
        if (group, logprobs) not in self.runners:
            model = self.owner()
            self.runners[group, logprobs] = _load_or_build(model, _folders.get(model), self.name(group, logprobs),
                                                           group, logprobs)
        return self.runners[group, logprobs]

    def step(self, logprobs: bool):
        if logprobs not in self.steps:
            make = _translation_step if is_translation(self.owner()) else _language_model_step
            self.steps[logprobs] = make(self, logprobs)
        return self.steps[logprobs]


def _held(model: nn.Module) -> _Steps:
    version = _weights_version(model)
    held = _steps.get(model)
    if held is None or held.version != version:
        held = _steps[model] = _Steps(model, version)
    return held


def _translation_step(steps: _Steps, logprobs: bool):
    model = steps.owner()
    slots = torch.arange(model.cfg.max_len, device=next(model.parameters()).device)

    def step(tgt, index, k, v, cross_kv, memory_mask, upto, group=1):
        _one_token(tgt)
        if memory_mask is None:  # no padding in the sources: a mask that hides nothing
            key = cross_kv[0][0]
            memory_mask = masks.attend_everywhere(key.size(0), key.size(2), key.device)
        return steps.runner(group, logprobs)(tgt, index, slots[:upto], k, v, tuple(c[0] for c in cross_kv),
                                             tuple(c[1] for c in cross_kv), memory_mask)

    return step


def _language_model_step(steps: _Steps, logprobs: bool):
    model = steps.owner()
    slots = torch.arange(model.cfg.max_len, device=next(model.parameters()).device)

    def step(tokens, real, index, k, v, key_mask, next_position, upto):
        _one_token(tokens)
        return steps.runner(1, logprobs)(tokens, real, index, slots[:upto], k, v, key_mask, next_position)

    return step


def _one_token(tokens) -> None:
    if tokens.size(1) != 1:
        raise ValueError(f"the compiled step takes one new token a row, got {tokens.size(1)}; "
                         "feed a prompt through the eager step")


def _load_or_build(model: nn.Module, folder: Path | None, name: str, group: int, logprobs: bool):
    if folder is not None:
        path = folder / name
        if path.is_file():
            try:
                return aot.load(path)
            except Exception as e:  # noqa: BLE001 (a damaged file: built again below)
                warnings.warn(f"{path}: cannot be loaded ({e}); building it again", stacklevel=4)
        if _writable(folder):
            aot.build(model, group, logprobs, path)
            _drop_older(folder, name)
            return aot.load(path)
        warnings.warn(f"{folder}: cannot keep a compiled step there (not writable); building it for this "
                      "process only", stacklevel=4)
    path = _scratch() / name
    if not path.is_file():
        aot.build(model, group, logprobs, path)
    return aot.load(path)


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def _drop_older(folder: Path, name: str) -> None:
    """Remove the packages of the same kind built for other weights (or code) than ``name``'s:
    a run keeps one package per kind of step."""
    kind = name.rsplit("-", 1)[0]
    for old in folder.glob(f"{kind}-*.pt2"):
        if old.name != name and old.name.rsplit("-", 1)[0] == kind:
            old.unlink(missing_ok=True)


@cache
def _scratch() -> Path:
    """A temporary folder for the packages of models without a folder of their own, removed
    when the process ends."""
    path = Path(tempfile.mkdtemp(prefix="transformer-steps-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _weights_version(model: nn.Module) -> tuple[int, ...]:
    """Changes when a parameter or buffer is modified in place or replaced, or the model
    switches between training and eval mode."""
    return (int(model.training), *(x for t in (*model.parameters(), *model.buffers()) for x in (id(t), t._version)))


def should_compile(compile: str, model, *, group: int = 1, logprobs: bool = True, rows: int = 0,
                   new_tokens: int = 0) -> bool:
    """Whether a search runs the compiled step: the one place this is decided.

    Args:
        compile: ``on`` (build the step if it is missing), ``off``, or ``auto``: when the
            step is built already (:func:`has_package`) or the generation of ``new_tokens``
            is long enough to pay for building it (:data:`AUTO_MIN_STEPS`).
        model: the model (an ensemble decodes eagerly).
        group, logprobs: which step (rows per source sentence: 1 for greedy search and
            generation, the beam size for beam search; log-probabilities or logits).
        rows: a translation batch's decoder rows (sentences x beam); more than
            :data:`MAX_COMPILED_ROWS` decode eagerly (no slower there). 0: not known yet.
    """
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {compile!r}")
    if compile == "off" or not compilable(model) or (is_translation(model) and rows > MAX_COMPILED_ROWS):
        return False
    return compile == "on" or new_tokens >= AUTO_MIN_STEPS or has_package(model, group, logprobs)


def search_step(model, compile: str, *, group: int = 1, logprobs: bool = True, rows: int = 0,
                new_tokens: int = 0):
    """The step a search runs (:mod:`transformer.decode.steps`): the compiled one on a
    fixed-shape cache where :func:`should_compile` says so, else ``model.decode`` on the
    growing cache."""
    if should_compile(compile, model, group=group, logprobs=logprobs, rows=rows, new_tokens=new_tokens):
        return FixedShapeStep(model, compiled_step(model, logprobs), logprobs)
    return GrowingStep(model, logprobs)


def cache_capacity(longest_prompt: int, new_tokens: int, max_len: int) -> int:
    """The positions a search's fixed-shape cache holds: enough for the longest prompt and
    every new token, rounded up to a multiple of 64 (fewer distinct buffer sizes), and never
    more than ``max_len``."""
    need = longest_prompt + new_tokens
    return min(max_len, -(-need // 64) * 64)
