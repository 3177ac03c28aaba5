"""``transformer evaluate``: translate a test set and score it with sacreBLEU and chrF."""
from __future__ import annotations

import argparse
import json
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="translate --src and score against --ref (sacreBLEU, chrF)")
    p.add_argument("--model", required=True, help="run directory or .safetensors file")
    p.add_argument("--src", required=True, help="source file, one sentence a line (.gz allowed)")
    p.add_argument("--ref", required=True, help="reference translations, untouched (.gz allowed)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--output", help="also write the translations here")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..data import read_lines
    from ..errors import UserError
    from ..evaluate import score
    from ..fileio import write_text_atomic
    from ..translator import load_translator

    if args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    src, ref = read_lines(args.src), read_lines(args.ref)
    if len(src) != len(ref):
        raise UserError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}; they must be aligned")
    translator = load_translator(args.model, beam_size=args.beam, alpha=args.alpha,
                                 max_tokens=args.max_tokens, device=args.device)
    t0 = time.perf_counter()
    hyps = translator.translate(src)
    seconds = time.perf_counter() - t0
    scores = score(hyps, ref)
    if args.output:
        write_text_atomic(args.output, "".join(h + "\n" for h in hyps))
    if args.json:
        print(json.dumps({**scores.to_dict(), "beam": args.beam, "seconds": seconds, "model": args.model}))
    else:
        print(scores.summary())
        print(f"beam {args.beam}, {len(src)} sentences in {seconds:.1f}s")
    return 0
