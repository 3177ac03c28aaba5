"""Where packages (:mod:`.build`) are kept, and the checks before one is loaded: loading runs the
library inside, so only this user's own builds are loaded. They live in the user's cache, never in
a run directory (:func:`run_folder`), in folders no one else may write (:func:`usable`), each with
the SHA-256 its build recorded (:func:`record`, :func:`check`). The folders' checks are
:mod:`transformer.run.private`'s. No torch here."""
from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from ..errors import UserError
from ..run import private
from ..run.files import atomic_write, file_sha256
from ..run.private import DIR_ENV_VAR, CompiledStepWarning, cache_root, is_private, scratch  # noqa: F401

SWITCH_ENV_VAR = "TRANSFORMER_COMPILE"
DIGEST = ".sha256"  # the suffix of a package's recorded digest: NAME.pt2.sha256
# A build being written (build.build: ``.NAME.XXXX.pt2``; a digest: ``.NAME.sha256.XXXX.tmp``)
# by another process is left alone; one older than any build is a crash's leftover.
GRACE_S = 3600.0


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


def run_folder(run_dir: str | Path) -> Path | None:
    """``<run name>-<digest of its resolved path>`` in :func:`cache_root`: the run's folder."""
    root = cache_root()
    if root is None:
        return None
    resolved = Path(run_dir).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", resolved.name)[:40].lstrip(".") or "run"
    return root / f"{name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"


def usable(folder: Path) -> Path:
    """``folder`` made private and checked (:func:`transformer.run.private.usable`), its crashed
    builds' leftovers swept; a private temporary folder instead, with one warning."""
    return private.usable(folder, "compiled decoding steps are kept", prepare=sweep)


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
