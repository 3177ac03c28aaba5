"""Compiled decoding, beside the model: one decoding step built ahead of time into generated C++
and reused for every step of a search, on a fixed-shape cache. Entered through one function,
whose step a search runs as it runs the eager one (the front door chooses: ``FrontDoor.search_step``):

    beam_search(model, src, beam_size=4, step=compiled.step(model, group=4))

search_step.py: the fixed-shape cache and the step that drives a search; graph.py: the step as
a graph; build.py: exported, built into a package (tens of seconds to minutes) and loaded;
packages.py: where packages live and the checks before one is loaded. A model from a run keeps
one package per kind of step in its run's folder of the user's cache (:func:`keep_for_run`); a
step that cannot be built or loaded runs eagerly, with one warning (benchmarks/decode/README.md).
"""
from __future__ import annotations

import warnings
import weakref
from functools import partial
from pathlib import Path

from torch import nn

from ..decode import decoding_copy
from . import build, packages
from .packages import CompiledStepWarning, switched_off
from .search_step import CompiledStep

__all__ = ["step", "is_built", "keep_in", "keep_for_run", "switched_off", "CompiledStepWarning"]

_folders: "weakref.WeakKeyDictionary[nn.Module, Path]" = weakref.WeakKeyDictionary()
_held: "weakref.WeakKeyDictionary[nn.Module, _Packages]" = weakref.WeakKeyDictionary()


def step(model: nn.Module, group: int = 1, logprobs: bool = True) -> CompiledStep:
    """The search step that runs the compiled step of ``model`` (a Transformer or LanguageModel)
    for ``group`` rows per source sentence (1: greedy search, generation; else the beam size),
    giving log-probabilities (``logprobs``) or logits. Its package is loaded, or built, at the
    first step (or :meth:`CompiledStep.prepare`); changed weights or mode get a package of their
    own. ``TRANSFORMER_COMPILE=off``: run eagerly. A decoding copy's packed weights are made
    plain first (:func:`transformer.decode.decoding_copy.unpack`): the graph is traced, and
    its package named, from the module's parameters."""
    decoding_copy.unpack(model)
    return CompiledStep(model, partial(_packages_of(model).runner, group, logprobs), logprobs)


def is_built(model: nn.Module, group: int = 1, logprobs: bool = True) -> bool:
    """Whether the package :func:`step` would run is there already, in memory or on disk."""
    return _packages_of(model).ready(group, logprobs)


def keep_in(model: nn.Module, folder: str | Path) -> None:
    """Load and build the packages of ``model`` in ``folder`` (if it is private: :func:`.packages.usable`)."""
    _folders[model] = Path(folder)


def keep_for_run(model: nn.Module, run_dir: str | Path) -> None:
    """Keep the packages of ``model`` in the cache folder of its run (:func:`.packages.run_folder`)."""
    if (folder := packages.run_folder(run_dir)) is not None:
        keep_in(model, folder)


class _Packages:
    """The loaded (or eager) steps of one model at one weights version."""

    def __init__(self, model: nn.Module, version: tuple) -> None:
        self.owner = weakref.ref(model)  # an entry must not keep its own key (the model) alive
        self.version = version
        self.names: dict[tuple[int, bool], str] = {}
        self.runners: dict[tuple[int, bool], object] = {}

    def name(self, group: int, logprobs: bool) -> str:
        if (group, logprobs) not in self.names:
            self.names[group, logprobs] = build.package_name(self.owner(), group, logprobs)
        return self.names[group, logprobs]

    def ready(self, group: int, logprobs: bool) -> bool:
        folder = _folders.get(self.owner())
        return (group, logprobs) in self.runners or (
            folder is not None and packages.is_private(folder) and packages.ready(folder / self.name(group, logprobs)))

    def runner(self, group: int, logprobs: bool):
        if switched_off():  # (TRANSFORMER_COMPILE=off wins over a step asked for directly, too)
            return _eager(self.owner(), group, logprobs)
        if (group, logprobs) not in self.runners:
            model = self.owner()
            folder = _folders.get(model)
            folder = packages.scratch() if folder is None else packages.usable(folder)
            self.runners[group, logprobs] = _load_or_build(model, folder, self.name(group, logprobs), group, logprobs)
        return self.runners[group, logprobs]


def _packages_of(model: nn.Module) -> _Packages:
    # changed by a weight modified in place or replaced, or a switch between training and eval
    version = (int(model.training), *(x for t in (*model.parameters(), *model.buffers()) for x in (id(t), t._version)),
               *map(id, decoding_copy.packed_tensors(model)))  # (a decoding copy's packed weights: never changed in place)
    held = _held.get(model)
    if held is None or held.version != version:
        held = _held[model] = _Packages(model, version)
    return held


def _load_or_build(model: nn.Module, folder: Path, name: str, group: int, logprobs: bool):
    """The step in ``folder / name``, built first if it is missing (or refused: deleted and
    built again; or gone while it was loaded: tried once more); else eagerly, with a warning."""
    path = folder / name
    for _ in range(2):
        try:
            if path.is_file() and (run := _load_checked(path, "deleted, building it again")) is not None:
                return run
            try:
                build.build(model, group, logprobs, path)
                packages.record(path)
                packages.drop_older(folder, name)
            except Exception as e:  # noqa: BLE001 (no C++ compiler, an inductor error, a full disk)
                _warn(f"cannot build the compiled decoding step ({_first_line(e)}); decoding eagerly")
                return _eager(model, group, logprobs)
            return _load_checked(path, "decoding eagerly") or _eager(model, group, logprobs)
        except FileNotFoundError:
            continue
    _warn(f"{path}: removed by another process while it was being loaded, twice; decoding eagerly")
    return _eager(model, group, logprobs)


def _load_checked(path: Path, then: str):
    """The step in the package at ``path`` once its SHA-256 is checked; None (after a warning
    saying what ``then``, the package deleted) when it is refused; FileNotFoundError when it
    vanished meanwhile."""
    problem = packages.check(path)
    if problem is None:
        try:
            return build.load(path)
        except Exception as e:  # noqa: BLE001 (damaged, or built by an incompatible torch)
            if not path.exists():
                raise FileNotFoundError(path) from None
            problem = f"cannot be loaded ({_first_line(e)})"
    _warn(f"{path}: {problem}; {then}")
    packages.remove(path)
    return None


def _eager(model: nn.Module, group: int, logprobs: bool):
    owner = weakref.ref(model)  # (kept with the model's steps: must not keep the model alive)
    return lambda *args: build.step_module(owner(), group, logprobs)(*args)


def _warn(message: str) -> None:
    warnings.warn(message, CompiledStepWarning, stacklevel=5)


def _first_line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__
