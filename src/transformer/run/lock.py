"""One writer per run: ``transformer train`` holds an advisory lock on ``RUN_DIR/.lock`` for
its whole life, so a second ``train`` on the same run stops at once with one line naming
the first one's pid, instead of interleaving its checkpoints with the first one's.
Readers (translate, evaluate, serve) never take it.

The lock is ``flock`` on an open file: the kernel drops it when its holder exits however it
exits (SIGKILL included), so a crash never leaves a lock to clear by hand; a ``.lock`` file
left behind by one is taken over by the next start. The file holds the holder's pid, for the
message. Where there is no ``flock`` (Windows) or the filesystem refuses it (some network
filesystems), training runs unlocked, as it did before there was a lock.

Taking the lock first refuses a run that holds a symbolic link anywhere inside it
(:func:`~transformer.run.files.refuse_links`): every file a writer of the run touches is
then the run's own, and ``.lock`` itself is opened without following a link.

Imports nothing but the standard library (and :mod:`transformer.errors`, :mod:`.files`).
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import UserError
from .files import refuse_links

LOCK = ".lock"


class RunLock:
    """The lock on one run directory, held until :meth:`release` (or until the process ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        """Drop the lock and remove the file (only if it is still this lock's file)."""
        if self.fd is None:
            return
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __del__(self) -> None:
        self.release()


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` and its parents (an existing one is fine); UserError when it cannot be."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{run_dir}: cannot create the run directory ({e.strerror or e})") from None


def lock_run(run_dir: str | Path, what: str = "transformer train") -> RunLock | None:
    """Take ``run_dir``'s writer lock (the folder is made if missing); None where locks are
    not available. Raises UserError when another process holds it, naming its pid."""
    run_dir = Path(run_dir)
    make_run_dir(run_dir)
    refuse_links(run_dir)
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no advisory locks
        return None
    path = run_dir / LOCK
    while True:
        try:  # O_NOFOLLOW: a link put there after the check is refused too (ELOOP), never written through
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP:
                refuse_links(run_dir)  # names the link
            raise UserError(f"{run_dir}: cannot write ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            who = f"another {what} (pid {pid})" if pid else f"another {what}"
            raise UserError(f"{run_dir}: {who} is writing this run; wait for it to finish, "
                            "or use another --out") from None
        except OSError:  # ENOLCK, EOPNOTSUPP: this filesystem keeps no locks
            os.close(fd)
            return None
        # The holder before us may have released and removed the file between our open and
        # our flock: then we hold a lock on a file nobody else can see. Lock the one at the path.
        if _same_file(fd, path):
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return RunLock(path, fd)


def _holder(fd: int) -> int | None:
    """The pid written in the lock file (None while its holder has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
