"""``transformer generate``: continue a prompt with a trained language model, streaming the
text to stdout as the tokens are produced."""
from __future__ import annotations

import argparse
import sys

from ._options import add_decoding_options, check_count, decoding_options, prepare_compiled

SEPARATOR = "-" * 15  # between samples, as nanoGPT's sample.py prints them


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a language model (streams to stdout)")
    p.add_argument("--model", required=True, help="run directory of a language model (or a .safetensors file in one)")
    p.add_argument("--prompt", help="the text to continue (default: stdin when it is not a terminal, else empty)")
    p.add_argument("--num-samples", type=int, default=1, metavar="N",
                   help="continuations of the prompt, one after another, sample n with seed + n (the rows "
                        "of one batch of n prompts with the same seed) (default: 1)")
    add_decoding_options(p, "max_new_tokens", "temperature", "top_k", "top_p", "seed", "precision", "device", "compile")
    p.set_defaults(func=run,
                   memory_remedy="try --precision bf16 (half the memory of fp32), or a machine with more memory")


def run(args: argparse.Namespace) -> int:
    from ..inference.generator import Generator

    check_count(args, "num_samples")
    prompt = args.prompt
    if prompt is None:
        prompt = "" if sys.stdin.isatty() else _read_stdin()
    generator = Generator.from_pretrained(args.model, warn=False, **decoding_options(args))
    prepare_compiled(generator)
    generator.encode(prompt)
    if generator.truncated:
        print(f"warning: the prompt is longer than the model's context ({generator.model.cfg.max_len} tokens); "
              "continuing its end", file=sys.stderr)
    out = sys.stdout
    for n in range(args.num_samples):  # one sample at a time, so that each streams as it is made
        out.write(prompt)
        for pieces in generator.stream([prompt], seed_offset=n):
            out.write(pieces[0])
            out.flush()
        out.write("\n" if args.num_samples == 1 else f"\n{SEPARATOR}\n")
        out.flush()
    return 0


def _read_stdin() -> str:
    from ..data import decode_lines

    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
    return "\n".join(decode_lines(data, "<stdin>"))

