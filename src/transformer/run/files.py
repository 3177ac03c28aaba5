"""Writing files so that nothing is ever half-written: a temporary file (or folder) beside
the target, flushed to disk, then renamed over it, so readers see the old or the new
content and a crash leaves at most a hidden temporary name behind. Every writer of the
project goes through :func:`atomic_write` or :func:`atomic_dir`.

A full disk, a read-only filesystem or a quota reaches the writers as OSError from Python's
own files, but libraries wrap it: safetensors raises ``SafetensorError("... (os error 28)")``
and ``torch.save`` a ``RuntimeError`` that names no cause at all. :func:`storage_error` finds
the OSError inside the first, :class:`RecordingWriter` catches it for the second, so both
end as the same one-line error as Python's own. :func:`home_cache` names where the caches
(downloaded data, compiled decoding steps) live by default."""
from __future__ import annotations

import errno
import hashlib
import io
import os
import re
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


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def storage_error(e: BaseException) -> OSError | None:
    """The OSError a writer's exception stands for (disk full, read-only, quota, permission),
    or None when it is not one: OSError itself, or a library's error that carries the
    system's error number in its message (safetensors: ``I/O error: ... (os error 28)``)."""
    if isinstance(e, OSError):
        return e
    found = _OS_ERROR.search(str(e)) if isinstance(e, Exception) else None
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code) if code in errno.errorcode else str(e))


class RecordingWriter(io.RawIOBase):
    """A binary file for a library that swallows the OSError of a failed write (``torch.save``
    turns ENOSPC into ``RuntimeError: unexpected pos``): writes go to ``file``, and the first
    OSError is kept in :attr:`error` for the caller to raise instead."""

    def __init__(self, file) -> None:
        super().__init__()
        self.file, self.error = file, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as e:
            self.error = self.error or e
            raise


def refuse_links(folder: str | Path) -> None:
    """A one-line UserError naming the first symbolic link inside ``folder``, at any depth
    (``folder`` itself may be one: the user named it). A run folder someone hands over may
    hold a link where a run file should be (``.lock``, ``metrics.jsonl``, ``checkpoints/``);
    writing the run through it would change a file outside the run, so every writer of a run
    checks first (:func:`~transformer.run.lock.lock_run`)."""
    for top, dirs, names in os.walk(folder):  # followlinks=False: a linked folder is listed, not entered
        for name in sorted(dirs + names):
            if os.path.islink(link := os.path.join(top, name)):
                raise UserError(f"{link}: a symbolic link inside the run {folder}; transformer writes nothing "
                                "through links in a run (the file it names, outside the run, would change): "
                                "remove the link, or put the file itself there")


def open_to_append(path: str | Path):
    """``path`` opened to append UTF-8 text (made if missing), never through a symbolic link:
    a link there is an OSError (ELOOP), not a write into the file it names."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return open(fd, "a", encoding="utf-8")


def make_parent(path: Path) -> None:
    """Make ``path``'s folder (and those above it); a file where a folder is needed is named
    (NotADirectoryError), where mkdir says only "File exists"."""
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file, not a folder", str(folder))
            break
    path.parent.mkdir(parents=True, exist_ok=True)


def atomic_write(path: str | Path, write: Callable[[str], None], suffix: str = ".tmp") -> Path:
    """Call ``write(tmp_path)`` then move the result to ``path``. On any failure the target
    keeps its earlier content and no temporary file is left (``suffix``: the temporary file's,
    for writers that want a particular one). Raises UserError when the folder cannot be
    written, also when ``write`` is a library that wraps the OSError (see :func:`storage_error`)."""
    path = Path(path)
    try:
        make_parent(path)
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
    try:
        write(tmp)
        os.chmod(tmp, _mode_for(path))
        _fsync_file(Path(tmp))
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if (os_error := storage_error(e)) is None:
            raise
        raise UserError(f"{path}: cannot write ({os_error.strerror or os_error}); "
                        "any earlier file there is intact") from None
    return path


def _mode_for(path: Path) -> int:
    """The permissions a file written to ``path`` gets: those of the file it replaces (a 0600
    file stays private), else the usual ones for a new file (mkstemp makes 0600 files)."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    return 0o666 & ~umask()


def write_text_atomic(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_output(path: str | Path, write: Callable[[io.TextIOBase], None]) -> None:
    """A user's output file (``--output``): ``write(f)`` into a UTF-8 text file beside ``path``
    that is renamed into place when complete (through a symbolic link: its target, the link
    kept). What is not a file (/dev/stdout, /dev/null, a named pipe) cannot be renamed over,
    only written into, as the shell's ``>`` does: renaming would replace the device or pipe
    with a file and the reader get nothing."""
    import stat

    try:
        mode = os.stat(path).st_mode  # through links: /dev/stdout is one
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        try:
            f = open(path, "w", encoding="utf-8")
        except OSError as e:
            raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
        with f:
            write(f)
        return

    def to_file(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            write(f)

    atomic_write(os.path.realpath(path) if os.path.islink(path) else path, to_file)


def atomic_dir(path: str | Path, fill: Callable[[Path], None], make_room: Callable[[Path], None] | None = None) -> Path:
    """Call ``fill(tmp_dir)`` on a new folder beside ``path``, then rename it to ``path``.

    ``make_room(path)`` runs just before the rename when ``path`` exists (it must remove or
    move it away; without it, only an empty folder is replaced). Every file is flushed to
    disk first and gets the usual permissions. On any failure nothing is left under
    ``path`` that was not there before, and the temporary folder is removed. A storage
    failure is raised as OSError (also one a library wrapped, see :func:`storage_error`): the
    caller names what it was writing."""
    path = Path(path)
    make_parent(path)
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
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        os_error = storage_error(e)
        if os_error is None or os_error is e:
            raise
        raise os_error from None
    fsync_dir(path.parent)
    return path


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def home_cache(name: str) -> Path | None:
    """``~/.cache/transformer/<name>`` (it need not exist yet); None when no home directory
    can be found."""
    try:
        return Path.home() / ".cache" / "transformer" / name
    except RuntimeError:
        return None
