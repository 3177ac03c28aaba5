"""A progress bar on stderr for the commands that translate many lines (a leading
underscore: not a command module). It is drawn only when stderr is a terminal: a log file
or a pipe gets no carriage-return clutter, and no option is needed to silence it."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def line_progress(total: int | None, enabled: bool = True) -> Iterator[Callable[[int], object] | None]:
    """``with line_progress(total) as done: ... done(n) ...``: a tqdm bar counting lines up
    to ``total``, or ``done`` None when ``enabled`` is false or stderr is not a terminal."""
    if not (enabled and stderr_is_terminal()):
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="line", file=sys.stderr, dynamic_ncols=True, mininterval=0.5) as bar:
        yield bar.update
