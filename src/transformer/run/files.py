"""Writing files so that nothing is ever half-written: a temporary file (or folder) beside
the target, flushed to disk, then renamed over it, so readers see the old or the new
content and a crash leaves at most a hidden temporary name behind. Every writer of the
project goes through :func:`atomic_write` or :func:`atomic_dir`."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import UserError


def umask() -> int:
    """The process's file-creation mask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside ``path`` durable (a power cut, not only a crash)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write(path: str | Path, write: Callable[[str], None], suffix: str = ".tmp") -> Path:
    """Call ``write(tmp_path)`` then move the result to ``path``. On any failure the target
    keeps its earlier content and no temporary file is left (``suffix``: the temporary file's,
    for writers that want a particular one). Raises UserError when the
    folder cannot be written."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600 files; give the usual permissions
        _fsync_file(Path(tmp))
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write ({e.strerror or e}); any earlier file there is intact") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_dir(path: str | Path, fill: Callable[[Path], None], make_room: Callable[[Path], None] | None = None) -> Path:
    """Call ``fill(tmp_dir)`` on a new folder beside ``path``, then rename it to ``path``.

    ``make_room(path)`` runs just before the rename when ``path`` exists (it must remove or
    move it away; without it, only an empty folder is replaced). Every file is flushed to
    disk first and gets the usual permissions. On any failure nothing is left under
    ``path`` that was not there before, and the temporary folder is removed. OSError is
    raised as it comes: the caller names what it was writing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        fill(tmp)
        mask = umask()
        for f in tmp.iterdir():
            os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~mask)  # mkstemp/HF write 0600 files
            if f.is_file():
                _fsync_file(f)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes a 0700 folder
        if path.exists():
            if make_room is not None:
                make_room(path)
            else:
                path.rmdir()  # only an empty folder; a rename onto it fails on some systems
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(path.parent)
    return path


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
