"""``transformer translate``: translate lines with a trained model."""
from __future__ import annotations

import argparse
import sys

from ._options import add_precision_option


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate text (stdin to stdout by default)")
    p.add_argument("--model", required=True, nargs="+",
                   help="run directory or .safetensors file; several: decode them as an ensemble "
                        "(e.g. checkpoints of one run: RUN/checkpoints/step-*)")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    p.add_argument("--n-best", type=int, default=1, help="print the N best translations (tab-separated with scores)")
    p.add_argument("--input", help="input file, one sentence a line (default: stdin)")
    p.add_argument("--output", help="output file (default: stdout); written only when complete")
    p.add_argument("--max-tokens", type=int, default=4000, help="source tokens per batch")
    p.add_argument("--device", default="cpu")
    add_precision_option(p)
    p.set_defaults(func=run)


def _check(args) -> None:
    from ..errors import UserError

    if args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    if not 1 <= args.n_best <= args.beam:
        raise UserError(f"--n-best must be between 1 and --beam ({args.beam}), got {args.n_best}")
    if args.max_tokens < 1:
        raise UserError("--max-tokens must be positive")


def run(args: argparse.Namespace) -> int:
    from ..data import read_lines
    from ..fileio import write_text_atomic
    from ..translator import load_translator

    _check(args)
    translator = load_translator(args.model, beam_size=args.beam, alpha=args.alpha,
                                 max_tokens=args.max_tokens, device=args.device, warn=False,
                                 precision=args.precision)
    if args.input is None and sys.stdin.isatty():
        return _interactive(translator)
    lines = read_lines(args.input) if args.input is not None else _read_stdin()
    results = translator.translate_nbest(lines, args.n_best)
    report_truncated(translator)
    if args.n_best == 1:
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
