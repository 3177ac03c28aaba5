"""``transformer explain``: one sentence through the real model, in the seed's ten steps
(formula, tensor shapes with their dimension names, and telling numbers for each)."""
from __future__ import annotations

import argparse

from ._options import add_decoding_options, decoding_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="walk one sentence through the model step by step (the ten steps)")
    p.add_argument("sentence", help="the source sentence")
    p.add_argument("--model", required=True, help="run directory or .safetensors file")
    p.add_argument("--step", action="append", metavar="N",
                   help="print only step N (1..10; 3 means 3a-3c, or 3a, 3b, 3c); repeatable")
    p.add_argument("--json", action="store_true", help="print the steps as JSON")
    p.add_argument("--target", help="teacher-force this translation instead of the model's own")
    add_decoding_options(p, "beam", "device")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from ..errors import UserError
    from ..translator import load_translator
    from ..viz.maps import prepare_pair
    from ..viz.walkthrough import format_text, to_dict, walk

    if not args.sentence.strip():
        raise UserError("the sentence is empty; give some text to explain")
    wanted = _steps(args.step)
    translator = load_translator(args.model, **decoding_options(args))
    pair = prepare_pair(translator, args.sentence, args.target)
    w = walk(translator.model, pair.src_ids, pair.tgt_ids, translator.subwords.id_to_piece)
    if wanted is not None:
        w.steps = [s for s in w.steps if s.number in wanted]
    if args.json:
        print(json.dumps({"source": pair.source, "translation": pair.translation, **to_dict(w)},
                         ensure_ascii=False, indent=1))
    else:
        print(f"source:      {pair.source}\ntranslation: {pair.translation}\n")
        print(format_text(w))
    return 0


STEPS = ["1", "2", "3a", "3b", "3c", "4", "5", "6", "7", "8", "9", "10"]


def _steps(asked: list[str] | None) -> set[str] | None:
    from ..errors import UserError

    if not asked:
        return None
    wanted = set()
    for a in asked:
        a = a.strip().lower()
        found = {s for s in STEPS if s == a or (a == "3" and s.startswith("3"))}
        if not found:
            raise UserError(f"--step {a}: no such step; choose from 1..10, 3a, 3b, 3c")
        wanted |= found
    return wanted
