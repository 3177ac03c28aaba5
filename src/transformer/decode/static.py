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
its steps in the user's cache, in a folder of the run's (:func:`keep_packages_for`,
:mod:`transformer.decode.packages`: never in the run directory, and each package's SHA-256
checked before it is loaded), so a step is built once and every later command finds it:
``compile="auto"`` (the commands' default) decodes through a step that is there already, and
builds one only for a generation of at least :data:`AUTO_MIN_STEPS` new tokens;
``compile="on"`` builds what is missing. A model without a run builds its steps into a
temporary folder, for the process. ``TRANSFORMER_COMPILE=off`` decodes eagerly whatever
``compile`` says. A step that cannot be built (no C++ compiler, an inductor error) or loaded
is run eagerly on the fixed-shape cache, with one warning. Measured in
``benchmarks/lm/README.md`` and ``benchmarks/decode/README.md``.
"""
from __future__ import annotations

import warnings
import weakref
from pathlib import Path

import torch
from torch import nn

from ..model import LanguageModel, Transformer
from . import aot, packages
from .config import COMPILE_CHOICES
from .precision import uses_int8_gemm
from .steps import FixedShapeStep, GrowingStep, is_translation

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
    """Look for the compiled steps of ``model`` in ``folder``, and keep those built there: a
    folder of this user's that no one else may write (else the process uses a temporary one,
    :func:`transformer.decode.packages.usable`)."""
    _folders[model] = Path(folder)


def keep_packages_for(model: nn.Module, run_dir: str | Path) -> None:
    """Keep the compiled steps of ``model``, loaded from the run at ``run_dir``, in the run's
    folder of the user's cache (:func:`transformer.decode.packages.run_folder`); never in
    the run directory."""
    folder = packages.run_folder(run_dir)
    if folder is not None:
        keep_packages_in(model, folder)


def compilable(model) -> bool:
    """Whether ``model`` has the parts a fixed-shape step is built from (an ensemble, or a
    stand-in with only ``encode`` / ``start_cache`` / ``decode``, decodes eagerly)."""
    return isinstance(model, (Transformer, LanguageModel))


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
            folder is not None and packages.is_private(folder) and packages.ready(folder / self.name(group, logprobs)))

    def runner(self, group: int, logprobs: bool):
        if packages.switched_off():  # (TRANSFORMER_COMPILE=off wins over a step asked for directly, too)
            return _eager(self.owner(), group, logprobs)
        if (group, logprobs) not in self.runners:
            model = self.owner()
            folder = _folders.get(model)
            folder = packages.scratch() if folder is None else packages.usable(folder)
            self.runners[group, logprobs] = _load_or_build(model, folder, self.name(group, logprobs), group, logprobs)
        return self.runners[group, logprobs]

    def step(self, logprobs: bool):
        if logprobs not in self.steps:
            model = self.owner()
            make = _translation_step if is_translation(model) else _language_model_step
            # the cache slots 0 .. max_len - 1 on the model's device: a step passes the first `upto`
            slots = torch.arange(model.cfg.max_len, device=next(model.parameters()).device)
            self.steps[logprobs] = make(self, slots, logprobs)
        return self.steps[logprobs]


def _held(model: nn.Module) -> _Steps:
    version = _weights_version(model)
    held = _steps.get(model)
    if held is None or held.version != version:
        held = _steps[model] = _Steps(model, version)
    return held


def _translation_step(steps: _Steps, slots: torch.Tensor, logprobs: bool):
    def step(tgt, index, k, v, cross_kv, memory_mask, upto, group=1):
        _one_token(tgt)
        return steps.runner(group, logprobs)(tgt, index, slots[:upto], k, v, tuple(c[0] for c in cross_kv),
                                             tuple(c[1] for c in cross_kv), memory_mask)

    return step


def _language_model_step(steps: _Steps, slots: torch.Tensor, logprobs: bool):
    def step(tokens, real, index, k, v, key_mask, next_position, upto):
        _one_token(tokens)
        return steps.runner(1, logprobs)(tokens, real, index, slots[:upto], k, v, key_mask, next_position)

    return step


def _one_token(tokens) -> None:
    if tokens.size(1) != 1:
        raise ValueError(f"the compiled step takes one new token a row, got {tokens.size(1)}; "
                         "feed a prompt through the eager step")


def _load_or_build(model: nn.Module, folder: Path, name: str, group: int, logprobs: bool):
    """The step in ``folder / name``, built there first if it is missing; a package whose
    SHA-256 is not the one recorded by its build, or that does not load, is deleted and built
    again. A package that vanishes while it is loaded (another process cleaning up) is tried
    once more. Where no package can be had, the step runs eagerly (one warning each time)."""
    path = folder / name
    for _ in range(2):
        try:
            if path.is_file() and (run := _load_checked(path)) is not None:
                return run
            try:
                aot.build(model, group, logprobs, path)
                packages.record(path)
                packages.drop_older(folder, name)
            except Exception as e:  # noqa: BLE001 (no C++ compiler, an inductor error, a full disk)
                _warn(f"cannot build the compiled decoding step ({_first_line(e)}); decoding eagerly")
                return _eager(model, group, logprobs)
            if (run := _load_checked(path, built=True)) is not None:
                return run
            return _eager(model, group, logprobs)
        except FileNotFoundError:
            continue
    _warn(f"{path}: removed by another process while it was being loaded, twice; decoding eagerly")
    return _eager(model, group, logprobs)


def _load_checked(path: Path, built: bool = False):
    """The step in the package at ``path`` once its SHA-256 is checked; None (after one
    warning) when it is refused: deleted, to be built again, or (``built``: this process
    has just built it) to decode eagerly. FileNotFoundError when it vanished meanwhile."""
    then = "decoding eagerly" if built else "deleted, building it again"
    problem = packages.check(path)
    if problem is None:
        try:
            return aot.load(path)
        except Exception as e:  # noqa: BLE001 (damaged, or built by an incompatible torch)
            if not path.exists():
                raise FileNotFoundError(path) from None
            problem = f"cannot be loaded ({_first_line(e)})"
    _warn(f"{path}: {problem}; {then}")
    packages.remove(path)
    return None


def _eager(model: nn.Module, group: int, logprobs: bool):
    """The step a package holds, run eagerly (the same inputs and output)."""
    owner = weakref.ref(model)  # (kept with the model's steps: must not keep the model alive)
    return lambda *args: aot.eager_step(owner(), group, logprobs)(*args)


def _warn(message: str) -> None:
    warnings.warn(message, packages.CompiledStepWarning, stacklevel=5)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__


def _weights_version(model: nn.Module) -> tuple[int, ...]:
    """Changes when a parameter or buffer is modified in place or replaced, or the model
    switches between training and eval mode."""
    return (int(model.training), *(x for t in (*model.parameters(), *model.buffers()) for x in (id(t), t._version)))


def should_compile(compile: str, model, *, group: int = 1, logprobs: bool = True, rows: int = 0,
                   new_tokens: int = 0) -> bool:
    """Whether a search runs the compiled step: the one place this is decided.

    ``TRANSFORMER_COMPILE=off`` in the environment: never (whatever ``compile`` says).

    Args:
        compile: ``on`` (build the step if it is missing), ``off``, or ``auto``: when the
            step is built already (:func:`has_package`) or the generation of ``new_tokens``
            is long enough to pay for building it (:data:`AUTO_MIN_STEPS`).
        model: the model (an ensemble decodes eagerly, and so does an int8 model whose
            layers multiply with fbgemm's int8 GEMM: :func:`~transformer.decode.precision.uses_int8_gemm`).
        group, logprobs: which step (rows per source sentence: 1 for greedy search and
            generation, the beam size for beam search; log-probabilities or logits).
        rows: a translation batch's decoder rows (sentences x beam); more than
            :data:`MAX_COMPILED_ROWS` decode eagerly (no slower there). 0: not known yet.
    """
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, got {compile!r}")
    if compile == "off" or packages.switched_off() or not compilable(model):
        return False
    if uses_int8_gemm(model):  # faster eagerly: the compiled step would hold float32 weights
        if compile == "on":
            _warn("int8 on this CPU multiplies with fbgemm's int8 GEMM, which a compiled step cannot call "
                  "(it would hold the weights dequantised to float32, and ran slower); decoding eagerly")
        return False
    if is_translation(model) and rows > MAX_COMPILED_ROWS:
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
