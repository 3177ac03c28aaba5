"""Folders only this user may write, for what a process builds and then loads: compiled decoding
steps (:mod:`transformer.compiled.packages`) and the code torch's compiler generates
(:func:`use_private_build_folder`). Loading either runs code, so a folder that is not this user's,
or that others may write, is never used: the process works in a private temporary folder
instead, with one warning line (:func:`usable`). torch only inside
:func:`use_private_build_folder`, which must reach its compiler."""
from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import warnings
from functools import cache
from pathlib import Path
from typing import Callable

from .files import home_cache

DIR_ENV_VAR = "TRANSFORMER_COMPILED_DIR"
BUILD_ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"  # where torch's compiler writes, then loads, the code it generates


class CompiledStepWarning(UserWarning):
    """A package or build folder refused, a step not built or not loaded (the work goes on:
    rebuilt, eager, or in a temporary folder); the commands print one line."""


_checked: dict[Path, Path] = {}  # a folder -> the folder used instead of it (itself when usable)


def cache_root() -> Path | None:
    """The folder of the user's compiled steps (it need not exist yet): ``$TRANSFORMER_COMPILED_DIR``,
    else ``$XDG_CACHE_HOME/transformer/compiled``, else ``~/.cache/transformer/compiled``
    (made with mode 0700); None only when no home directory can be found."""
    if env := os.environ.get(DIR_ENV_VAR):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():  # (the XDG spec: a relative value is ignored)
        return Path(xdg) / "transformer" / "compiled"
    return home_cache("compiled")


def private_problem(folder: Path) -> str | None:
    """Why ``folder`` may not hold code to load (None: a folder of this user's no one else may write)."""
    try:
        st = folder.stat()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def usable(folder: Path, what: str, prepare: Callable[[Path], None] | None = None) -> Path:
    """``folder`` and its parent made (mode 0700) and checked once a process (``prepare(folder)``
    then); a private temporary folder instead, with one warning (``what`` happens there), when
    either cannot be made, written or is not private."""
    if folder not in _checked:
        problem = next((f"{f}: {why}" for f in (folder.parent, folder) if (why := _unusable(f))), None)
        if problem is None and prepare is not None:
            prepare(folder)
        elif problem is not None:
            warnings.warn(f"{problem}; {what} in a temporary folder for this process only (see "
                          "docs/run-folder.md, compiled steps)", CompiledStepWarning, stacklevel=3)
        _checked[folder] = folder if problem is None else scratch()
    return _checked[folder]


def _unusable(folder: Path) -> str | None:
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot be made ({e.strerror or e})"
    return private_problem(folder) or (None if os.access(folder, os.W_OK) else "not writable")


def is_private(folder: Path) -> bool:
    """Whether ``folder`` and its parent exist and are private (nothing made, no warning)."""
    if folder in _checked:
        return _checked[folder] == folder
    return private_problem(folder.parent) is None and private_problem(folder) is None


@cache
def scratch() -> Path:
    """A temporary folder (mode 0700) for this process, removed when it ends."""
    path = Path(tempfile.mkdtemp(prefix="transformer-steps-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def use_private_build_folder() -> Path:
    """Point torch's compiler at a private folder before it builds anything (a decoding step,
    training's ``compile: true``, the compiled loss): ``inductor/`` of :func:`cache_root`
    (``inductor-avx2/`` and the like under torch's ``ATEN_CPU_CAPABILITY`` switch, whose kernels
    must not mix with the others'), or the folder ``TORCHINDUCTOR_CACHE_DIR`` names, checked by
    :func:`usable`. torch's default, ``torchinductor_USER`` in the shared temporary folder, is a
    name another user can create first and plant code in, which a build would then load. The
    headers the compiler precompiles go to ``precompiled_headers/`` of that folder too."""
    given, root = os.environ.get(BUILD_ENV_VAR), cache_root()
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    name = f"inductor-{capability}" if capability else "inductor"
    wanted = Path(given).expanduser().absolute() if given else None if root is None else root / name
    folder = scratch() if wanted is None else usable(wanted, "torch's compiler builds")
    if folder != wanted:  # the process's temporary folder: a folder of its own in it
        folder = folder / name
        folder.mkdir(mode=0o700, exist_ok=True)
    os.environ[BUILD_ENV_VAR] = str(folder)
    _private_headers(folder / "precompiled_headers")
    return folder


def _private_headers(folder: Path) -> None:
    """Make the C++ headers torch's compiler precompiles (``.h.gch``, included by every C++
    file it builds) live in ``folder``. torch fixes their folder once, when its code cache is
    imported, at ``precompiled_headers/`` of ``torchinductor_USER`` in the shared temporary
    folder, whatever ``TORCHINDUCTOR_CACHE_DIR`` says: a header another user put there first
    would be compiled into every build. Kept rather than turned off, since a warm one saves
    each build its parse of torch's headers (benchmarks/decode/README.md)."""
    from torch._inductor import codecache

    if codecache._HEADER_DIR != str(folder):
        codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = str(folder), str(folder / "locks")
        codecache._precompile_header.cache_clear()  # (it remembers each header's path)
