"""``transformer translate``: translate lines with a trained model.

The input is read and translated in chunks of ``--chunk-lines`` lines, so memory does not
grow with its length; each chunk's lines are written in input order as soon as it is done
(on stdout, flushed chunk by chunk; an ``--output`` file appears, complete, at the end)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO

from ._options import (add_shortlist_from, shortlist_pairs, add_decoding_options, check_count, decoding_options, prepare_compiled, refuse_options,
                       refuse_output_over_inputs)

CHUNK_LINES = 2000  # lines read and translated at a time: enough to fill batches of similar lengths


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate text (stdin to stdout by default)")
    p.add_argument("--model", required=True, nargs="+", action="extend",
                   help="run directory or .safetensors file; several (after one --model, or --model repeated): "
                        "decode them as an ensemble "
                        "(e.g. checkpoints of one run: RUN/checkpoints/step-*)")
    p.add_argument("--input", help="input file, one sentence a line, .gz allowed (default: stdin); "
                                   "with a terminal on stderr, a progress bar shows the lines done")
    p.add_argument("--output", help="output file (default: stdout, written chunk by chunk); "
                                    "written only when complete")
    p.add_argument("--chunk-lines", type=int, metavar="N",
                   help=f"lines read and translated at a time; batches are sorted by length within a "
                        f"chunk (default: {CHUNK_LINES})")
    add_decoding_options(p, "beam", "alpha", "n_best", "max_tokens", "precision", "device", "compile", "shortlist")
    add_shortlist_from(p)
    p.set_defaults(func=run, memory_remedy="lower --beam, or --max-tokens (the source tokens decoded together)")


def run(args: argparse.Namespace) -> int:
    from ..data import count_lines
    from ..inference.translator import load_translator
    from ._progress import line_progress, stderr_is_terminal

    check_count(args, "chunk_lines", must="positive")
    typed = args.input is None and sys.stdin.isatty()
    if typed:
        refuse_options(args, ("output", "n_best", "chunk_lines"), "for input from a file or a pipe",
                       "sentences typed at the terminal are translated one by one, the best translation shown")
    if args.output:
        # (the --input file itself may be named: it is read whole before the output replaces it)
        refuse_output_over_inputs(args.output, {}, args.model)
    with _input_lines(args.input) as lines:  # opened first: a missing file fails before the model loads
        translator = load_translator(args.model, warn=False, shortlist_pairs=shortlist_pairs(args), **decoding_options(args))
        prepare_compiled(translator)
        if typed:
            return _interactive(translator)
        show = args.input is not None and stderr_is_terminal()
        # Counted ahead for the bar's total only in a file: a pipe (--input <(zcat ...)) read
        # twice gives its lines to the count, and nothing is left to translate.
        total = count_lines(args.input) if show and os.path.isfile(args.input) else None
        with line_progress(total, show) as done:
            chunks = translator.translate_stream(lines, args.chunk_lines or CHUNK_LINES, progress=done)
            if args.output:
                _write_output(args.output, chunks, translator.decoding.n_best)
            else:
                _write(chunks, sys.stdout, translator.decoding.n_best)
    report_truncated(translator)
    return 0


def _write(chunks: Iterable[list], out: TextIO, n_best: int) -> None:
    """Each chunk's translations (n-best: ``index<TAB>score<TAB>text`` rows, the index
    counting input lines), then a flush, so a reader sees lines as chunks finish."""
    first = 0
    for results in chunks:
        if n_best == 1:
            out.write("".join(r[0].text + "\n" for r in results))
        else:
            out.write("".join(f"{first + i}\t{t.score:.4f}\t{t.text}\n" for i, r in enumerate(results) for t in r))
        out.flush()
        first += len(results)


def _write_output(path: str, chunks: Iterable[list], n_best: int) -> None:
    """``--output``: complete or not at all (:func:`~transformer.run.files.write_output`)."""
    from ..run.files import write_output

    write_output(path, lambda f: _write(chunks, f, n_best))


@contextmanager
def _input_lines(path: str | None) -> Iterator[Iterator[str]]:
    """The input's lines, read lazily: ``path`` (see :func:`~transformer.data.open_lines`),
    else stdin, split and checked exactly as files are."""
    from ..data import iter_lines, open_lines

    if path is not None:
        with open_lines(path) as lines:
            yield lines
        return
    stream = getattr(sys.stdin, "buffer", None)  # a text-only stand-in (tests) has no buffer
    raw = stream if stream is not None else (s.encode("utf-8", "surrogateescape") for s in sys.stdin)
    yield iter_lines(raw, "<stdin>")


def report_truncated(translator) -> None:
    """One line on stderr when input lines were cut to the model's limit."""
    if translator.truncated:
        print(f"warning: {translator.truncated} line(s) longer than the model's limit "
              f"({translator.model.cfg.max_len - 1} subwords) were translated from their beginning only",
              file=sys.stderr)


def _interactive(translator) -> int:
    """Typed lines, read as bytes: a line that is not UTF-8 (a terminal set to Latin-1) gets
    one line saying so, and the session goes on."""
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    for raw in sys.stdin.buffer:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            print(f"transformer translate: error: that line is not UTF-8 (byte 0x{raw[e.start]:02x} at byte column "
                  f"{e.start + 1}); set the terminal to UTF-8", file=sys.stderr, flush=True)
            continue
        print(translator.translate([line.removesuffix("\n").removesuffix("\r")])[0], flush=True)
    return 0
