"""The ``transformer`` command. Each sub-command lives in its own module of this package
and exposes ``add_parser(subparsers)``, which registers it and sets ``func``."""
from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import UserError

COMMANDS = ["demo", "train", "translate", "evaluate", "average"]  # module names in this package, one per sub-command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
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
