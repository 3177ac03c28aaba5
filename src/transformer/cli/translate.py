"""``transformer translate``: translate lines with a trained model."""
from __future__ import annotations

import argparse
import sys

from ._options import add_decoding_options, decoding_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate text (stdin to stdout by default)")
    p.add_argument("--model", required=True, nargs="+",
                   help="run directory or .safetensors file; several: decode them as an ensemble "
                        "(e.g. checkpoints of one run: RUN/checkpoints/step-*)")
    p.add_argument("--input", help="input file, one sentence a line (default: stdin)")
    p.add_argument("--output", help="output file (default: stdout); written only when complete")
    add_decoding_options(p, "beam", "alpha", "n_best", "max_tokens", "precision", "device")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..data import read_lines
    from ..run.files import write_text_atomic
    from ..translator import load_translator

    translator = load_translator(args.model, warn=False, **decoding_options(args))
    if args.input is None and sys.stdin.isatty():
        return _interactive(translator)
    lines = read_lines(args.input) if args.input is not None else _read_stdin()
    results = translator.translate_nbest(lines)
    report_truncated(translator)
    if translator.decoding.n_best == 1:
        text = "".join(r[0].text + "\n" for r in results)
    else:
        text = "".join(f"{i}\t{t.score:.4f}\t{t.text}\n" for i, r in enumerate(results) for t in r)
    if args.output:
        write_text_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def report_truncated(translator) -> None:
    """One line on stderr when input lines were cut to the model's limit."""
    if translator.truncated:
        print(f"warning: {translator.truncated} line(s) longer than the model's limit "
              f"({translator.model.cfg.max_len - 1} subwords) were translated from their beginning only",
              file=sys.stderr)


def _read_stdin() -> list[str]:
    """Lines of stdin, split and checked exactly as input files are."""
    from ..data import decode_lines

    stream = getattr(sys.stdin, "buffer", None)  # a text-only stand-in (tests) has no buffer
    data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    return decode_lines(data, "<stdin>")


def _interactive(translator) -> int:
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    for line in sys.stdin:
        print(translator.translate([line.rstrip("\n")])[0], flush=True)
    return 0
