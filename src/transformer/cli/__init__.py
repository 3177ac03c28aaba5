"""The ``transformer`` command. Each sub-command lives in its own module of this package
and exposes ``add_parser(subparsers)``, which registers it and sets ``func``; modules are
found by name, so a new command is a new file here and nothing else."""
from __future__ import annotations

import argparse
import errno
import importlib
import pkgutil
import sys

from .. import __version__
from ..errors import UserError

# What the machine can refuse a command, whatever it was asked (a full disk, a read-only one,
# a quota, a file it may not touch), rather than a fault of the code.
_ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}

# The order in `transformer --help`; any other command module follows alphabetically.
ORDER = ["demo", "train", "translate", "generate", "evaluate", "average", "attention", "explain", "serve", "export",
         "import_"]


def command_modules() -> list[str]:
    found = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transformer", description="Train, use and look inside a from-scratch Transformer (Vaswani et al., 2017).")
    parser.add_argument("--version", action="version", version=f"transformer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_modules():
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"transformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except OSError as e:
        # The machine refused a write or a read (disk full, read-only, quota, permissions) in
        # a place no writer catches: one line, as for any user error. Every writer writes to
        # a temporary name and renames it (run/files.py), so nothing was half-written.
        if e.errno not in _ENVIRONMENT_ERRORS:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"transformer {args.command}: error: {where}{e.strerror or e}; files written before are intact",
              file=sys.stderr)
        return 2
