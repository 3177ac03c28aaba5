"""The ``transformer`` command. Each sub-command lives in its own module of this package
and exposes ``add_parser(subparsers)``, which registers it and sets ``func``; modules are
found by name, so a new command is a new file here and nothing else."""
from __future__ import annotations

import argparse
import errno
import importlib
import pkgutil
import sys
import warnings

from .. import __version__
from ..errors import OneLineWarning, UserError

# What the machine can refuse a command, whatever it was asked (a full disk, a read-only one,
# a quota, a file it may not touch), rather than a fault of the code.
_ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}

# The options that name a file or folder, in any command that has them. An empty one ("$RUN"
# with RUN unset) is the current folder to the filesystem, which was never what was meant.
PATH_OPTIONS = ("model", "out", "output", "input", "text", "src", "ref", "config", "data_dir")

# The order in `transformer --help` (by module: draw_attention.py is the `attention` command,
# demo.py the `toy` command); any other command module follows alphabetically.
ORDER = ["train", "translate", "generate", "evaluate", "average", "draw_attention", "explain", "lens", "heads",
         "serve", "export", "import_", "info", "demo"]


def command_modules() -> list[str]:
    found = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (a missing or unknown option, a value of the wrong
    type) are one line as every other error is: "transformer CMD: error: ... (see transformer CMD
    --help)", exit 2, instead of the usage block above the message. Sub-commands' parsers are
    of this class too (argparse makes them of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def unrecognized(self, extra: list[str]):
        """Arguments none of this command's options took (argparse would report them on the
        top-level parser, without the command's name). A command that reads text (explain's
        sentence, import's folder) most often meets them as the second word of unquoted text."""
        reads_text = any(not a.option_strings for a in self._actions)
        words = not any(a.startswith("-") for a in extra)  # not an option misspelt
        hint = "; text with spaces needs quotes" if reads_text and words else ""
        self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def build_parser() -> Parser:
    parser = Parser(
        prog="transformer", description="Train, use and look inside a from-scratch Transformer (Vaswani et al., 2017).")
    parser.add_argument("--version", action="version", version=f"transformer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_modules():
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    parser.commands = sub.choices  # name -> the command's own Parser
    return parser


def _refuse_empty_paths(args: argparse.Namespace) -> None:
    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
            raise UserError(f"--{name.replace('_', '-')} is empty; give a path")


def _refuse_undecodable_text(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Bytes of an argument that are not UTF-8 (a Latin-1 terminal) reach Python as lone
    surrogates (U+DC80..U+DCFF, see os.fsdecode), which no tokenizer encodes: one line naming
    the option and the byte. Paths are left alone: a file name need not be UTF-8."""
    names = {a.dest: (a.option_strings[0] if a.option_strings else f"the {a.dest}") for a in parser._actions}
    for dest, value in vars(args).items():
        if dest in PATH_OPTIONS:
            continue
        for text in value if isinstance(value, list) else [value]:
            bad = next((i for i, c in enumerate(text) if "\udc80" <= c <= "\udcff"), None) \
                if isinstance(text, str) else None
            if bad is not None:
                raise UserError(f"{names.get(dest, dest)} is not UTF-8 (byte 0x{ord(text[bad]) - 0xdc00:02x} at "
                                f"character {bad + 1}); give UTF-8 text (a Latin-1 terminal or file: convert it, "
                                "e.g. `iconv -f latin1 -t utf-8`)")


def out_of_memory(e: BaseException) -> str | None:
    """What an allocation that failed asked for ("tried to allocate 40.0 GB"), or None when
    ``e`` is not a failed allocation: Python's MemoryError, torch's on the CPU (a RuntimeError
    from DefaultCPUAllocator) or on a GPU (torch.OutOfMemoryError)."""
    import re

    text = str(e)
    if not (isinstance(e, MemoryError) or "can't allocate memory" in text or "not enough memory" in text
            or "out of memory" in text.lower()):
        return None
    asked = re.search(r"tried to allocate (\d+) bytes", text) or re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]iB)", text)
    if asked is None:
        return "an allocation failed"
    size = asked.group(1)
    return f"tried to allocate {int(size) / 2**30:.1f} GiB" if size.isdigit() else f"tried to allocate {size}"


def _one_line(shown):
    """``warnings.showwarning`` that prints a :class:`~transformer.errors.OneLineWarning` as
    ``warning: MESSAGE`` on stderr, and any other warning as ``shown`` does."""
    def show(message, category, *args, **kwargs):
        if issubclass(category, OneLineWarning):
            print(f"warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, *args, **kwargs)
    return show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].unrecognized(extra)
    try:
        _refuse_empty_paths(args)
        _refuse_undecodable_text(args, parser.commands[args.command])
        with warnings.catch_warnings():
            warnings.showwarning = _one_line(warnings.showwarning)
            return int(args.func(args) or 0)
    except UserError as e:
        print(f"transformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"transformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except (MemoryError, RuntimeError) as e:
        if (short := out_of_memory(e)) is None:
            raise
        remedy = getattr(args, "memory_remedy", "use smaller settings or a machine with more memory")
        print(f"transformer {args.command}: error: out of memory ({short}); {remedy}", file=sys.stderr)
        return 2
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
