"""An in-process runner of ``transformer.cli.main`` that hypothesis can call many times in
one test (no function-scoped fixtures), and the "works or one-line error" check."""
from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

# Few examples (the CLI examples decode real sentences), no deadline (a shared 2-core machine
# has slow moments), derandomised so that CI tries the same examples every time. Applied per
# test (not as a global profile, which would change other folders' hypothesis tests too).
PROPS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class Result:
    code: int
    out: str
    err: str


class _Stdin(io.TextIOWrapper):
    """A non-tty stdin whose ``buffer`` holds raw bytes (maybe invalid UTF-8)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")

    def isatty(self) -> bool:
        return False


def run_cli(*argv, stdin: bytes | None = None) -> Result:
    """``transformer.cli.main(argv)`` in-process with stdout/stderr captured."""
    from transformer.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = _Stdin(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.stdin = old_stdin
    return Result(code, out.getvalue(), err.getvalue())


def assert_works_or_one_line_error(r: Result, command: str) -> None:
    """Exit 0, or exit 2 with exactly one stderr line ``transformer COMMAND: error: ...``."""
    assert "Traceback" not in r.out + r.err
    if r.code == 0:
        return
    assert r.code == 2, (r.code, r.err[-2000:])
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"transformer {command}: error: "), r.err[-2000:]

