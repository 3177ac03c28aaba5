"""Where packages (:mod:`.build`) are kept, and the checks before one is loaded: loading runs the
library inside, so only this user's own builds are loaded. They live in the user's cache, never in
a run directory (:func:`run_folder`), in folders no one else may write (:func:`usable`), each with
the SHA-256 its build recorded (:func:`record`, :func:`check`). torch's compiler writes the code it
generates, then loads it, in a private folder of that cache too (:func:`use_private_build_folder`),
never in its default ``torchinductor_USER`` of the shared temporary folder. No torch here."""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
from functools import cache
from pathlib import Path

from ..errors import UserError
from ..run.files import atomic_write, file_sha256, home_cache

DIR_ENV_VAR = "TRANSFORMER_COMPILED_DIR"
SWITCH_ENV_VAR = "TRANSFORMER_COMPILE"
DIGEST = ".sha256"  # the suffix of a package's recorded digest: NAME.pt2.sha256
# A build being written (build.build: ``.NAME.XXXX.pt2``; a digest: ``.NAME.sha256.XXXX.tmp``)
# by another process is left alone; one older than any build is a crash's leftover.
GRACE_S = 3600.0


class CompiledStepWarning(UserWarning):
    """A package refused, not built or not loaded (decoding goes on); the commands print one line."""


_checked: dict[Path, Path] = {}  # a cache folder -> the folder used instead of it (itself when usable)


def switched_off() -> bool:
    """Whether ``TRANSFORMER_COMPILE=off`` turns compiled decoding off, whatever ``--compile`` or
    ``decoding.compile`` say (unset, empty and ``auto`` leave it to them; else a UserError)."""
    value = os.environ.get(SWITCH_ENV_VAR, "").strip().lower()
    if value in ("", "auto"):
        return False
    if value == "off":
        return True
    raise UserError(f"{SWITCH_ENV_VAR}={os.environ[SWITCH_ENV_VAR]}: the settings are off (every decoding "
                    "eager) and auto (the default: --compile decides); unset it or set it to off")


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


def run_folder(run_dir: str | Path) -> Path | None:
    """``<run name>-<digest of its resolved path>`` in :func:`cache_root`: the run's folder."""
    root = cache_root()
    if root is None:
        return None
    resolved = Path(run_dir).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", resolved.name)[:40].lstrip(".") or "run"
    return root / f"{name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"


def private_problem(folder: Path) -> str | None:
    """Why ``folder`` may not hold packages to load (None: a folder of this user's no one else may write)."""
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


def usable(folder: Path, what: str = "compiled decoding steps are kept") -> Path:
    """``folder`` and its parent made (mode 0700) and checked once a process; a private temporary
    folder instead, with one warning (``what`` happens there), when either cannot be made, written
    or is not private."""
    if folder not in _checked:
        problem = next((f"{f}: {why}" for f in (folder.parent, folder) if (why := _unusable(f))), None)
        if problem is None:
            sweep(folder)
        else:
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
    """A temporary folder (mode 0700) for this process's packages, removed when it ends."""
    path = Path(tempfile.mkdtemp(prefix="transformer-steps-"))
    atexit.register(shutil.rmtree, path, True)
    return path


BUILD_ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"  # where torch's compiler writes, then loads, the code it generates


def use_private_build_folder() -> Path:
    """Point torch's compiler at a private folder before it builds anything (a decoding step,
    training's ``compile: true``, the compiled loss): ``inductor/`` of :func:`cache_root` (made
    0700; ``inductor-avx2/`` and the like under torch's ``ATEN_CPU_CAPABILITY`` switch, whose
    kernels must not mix with the others'), or the folder ``TORCHINDUCTOR_CACHE_DIR`` names if
    the user set one. A folder that is not this user's, or that others may write, is refused: the
    process builds in a private temporary folder instead, with one warning line (:func:`usable`).
    torch's default, ``torchinductor_USER`` in the shared temporary folder, is a name another user
    of the machine can create first and plant code in, which a build then loads (and a package's
    recorded SHA-256 would approve)."""
    given, root = os.environ.get(BUILD_ENV_VAR), cache_root()
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    name = f"inductor-{capability}" if capability else "inductor"
    wanted = Path(given).expanduser().absolute() if given else None if root is None else root / name
    folder = scratch() if wanted is None else usable(wanted, "torch's compiler builds")
    if folder != wanted:  # the process's temporary folder: a folder of its own in it
        folder = folder / name
        folder.mkdir(mode=0o700, exist_ok=True)
    os.environ[BUILD_ENV_VAR] = str(folder)
    return folder


def digest_file(package: Path) -> Path:
    return package.with_name(package.name + DIGEST)


def ready(package: Path) -> bool:
    """Whether ``package`` and its recorded digest are both there (not yet whether they agree)."""
    return package.is_file() and digest_file(package).is_file()


def record(package: Path) -> None:
    """Record the SHA-256 of ``package``, just built by this process."""
    digest = file_sha256(package)
    atomic_write(digest_file(package), lambda tmp: Path(tmp).write_text(digest + "\n", encoding="ascii"))


def check(package: Path) -> str | None:
    """Why ``package`` may not be loaded (None: its SHA-256 is the one its build recorded);
    FileNotFoundError when it is gone (removed by another process)."""
    try:
        recorded = digest_file(package).read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        if not package.exists():
            raise
        return "no SHA-256 was recorded for it by a build of this user's"
    if file_sha256(package) != recorded:
        return "its SHA-256 is not the one recorded when it was built"
    return None


def remove(package: Path) -> None:
    """Delete a package and its recorded digest."""
    package.unlink(missing_ok=True)
    digest_file(package).unlink(missing_ok=True)


def drop_older(folder: Path, name: str) -> None:
    """Remove the packages of ``name``'s kind built for other weights or code (one per kind)."""
    kind = name.rsplit("-", 1)[0]
    for old in folder.glob(f"{kind}-*.pt2"):
        if old.name != name and old.name.rsplit("-", 1)[0] == kind:
            remove(old)


def sweep(folder: Path) -> None:
    """Delete the temporaries that crashed builds left in ``folder`` (over :data:`GRACE_S` old)."""
    now = time.time()
    for p in [*folder.glob(".*.pt2"), *folder.glob(f".*{DIGEST}.*.tmp")]:
        try:
            if now - p.lstat().st_mtime > GRACE_S:
                p.unlink()
        except OSError:
            pass
