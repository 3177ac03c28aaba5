"""``transformer explain``: one sentence through the real model, in the article's steps (formula,
tensor shapes with their dimension names, and telling numbers for each): the translation
model's ten steps, or a language model's prompt from We to the next token; with
``--training``, one training update in the article's formulas (-log p, dLoss/dW, the step).
``--beam`` and ``--compile`` choose how the translation is searched for; an option the walk,
as asked, does not use (``--beam`` with ``--target`` or for a language model, whose walk is one
forward pass over the prompt; a sampling option for a translation model) is a one-line error."""
from __future__ import annotations

import argparse

from ._options import (SAMPLING_OPTIONS, SEARCH_OPTIONS, add_decoding_options, decoding_options, prepare_compiled,
                       refuse_options)

DECODING = ("beam", "temperature", "top_k", "top_p", "compile", "device")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="walk one sentence (or a prompt) through the model step by step, "
                                       "or one training update (--training)")
    p.add_argument("sentence", nargs="?", help="the source sentence (translation model) or the prompt (language model)")
    p.add_argument("--model", required=True, help="run directory or .safetensors file")
    p.add_argument("--step", action="append", metavar="N",
                   help="print only step N (1..10 for a translation model, 1..9 for a language model; "
                        "3 means 3a-3c, or 3a, 3b, 3c); repeatable")
    p.add_argument("--json", action="store_true", help="print the steps as JSON")
    p.add_argument("--target", help="teacher-force this translation instead of the model's own")
    p.add_argument("--training", action="store_true",
                   help="explain one training update on the run's own first batch: Loss = -log p, dLoss/dW, "
                        "W_new = W_old - lr x gradient (SGD) beside Adam's step (the run's files are not changed)")
    p.add_argument("--matrix", metavar="NAME",
                   help="with --training: the matrix to follow, e.g. 'layer 1 WQ', 'layer 2 W_gate', We, Whead, "
                        "or a parameter name (default: layer 1 WQ; encoder layer 1's W_Q for a translation model)")
    p.add_argument("--lr", type=float, metavar="LR",
                   help="with --training: this learning rate instead of the run's schedule at its step")
    p.add_argument("--from-init", action="store_true",
                   help="with --training: start from a random initialisation (the run's seed), not the trained weights")
    add_decoding_options(p, *DECODING)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError
    from ..run import read_model_config

    if args.training:
        return _training(args)
    refuse_options(args, ("matrix", "lr", "from_init"), "for --training",
                   "without it, explain walks a sentence through the model")
    decoder_only = read_model_config(args.model).decoder_only
    if args.sentence is None or not args.sentence.strip():
        raise UserError(f"the {'prompt' if decoder_only else 'sentence'} is empty; give some text to explain "
                        "(or --training for a training update)")
    if decoder_only:
        return _language_model(args)
    return _translation(args)


def _translation(args: argparse.Namespace) -> int:
    from ..inference.translator import load_translator
    from ..viz.maps import prepare_pair
    from ..viz.walkthrough import format_text, to_dict, walk

    refuse_options(args, SAMPLING_OPTIONS, "for a language model", f"{args.model} is a translation model, "
                   "whose translation is searched for, not sampled")
    if args.target is not None:
        refuse_options(args, (*SEARCH_OPTIONS, "compile"), "for the search of the model's own translation",
                       "--target gives the translation")
    wanted = _steps(args.step, STEPS, "1..10, 3a, 3b, 3c")
    translator = load_translator(args.model, **{**decoding_options(args), "precision": "fp32"})  # the exact arithmetic shown
    if args.target is None:  # the model's own translation is searched for (--compile: how)
        prepare_compiled(translator)
    pair = prepare_pair(translator, args.sentence, args.target)
    w = walk(translator.model, pair.src_ids, pair.tgt_ids, translator.subwords.id_to_piece)
    return _print_walk(w, wanted, args.json, to_dict, format_text,
                       {"source": pair.source, "translation": pair.translation},
                       f"source:      {pair.source}\ntranslation: {pair.translation}\n")


def _language_model(args: argparse.Namespace) -> int:
    from ..viz.walkthrough_lm import STEPS as LM_STEPS
    from ..viz.walkthrough_lm import format_text, to_dict, token_shower, walk_lm
    from ._lm import load_language_model, prompt_ids

    refuse_options(args, ("target", *SEARCH_OPTIONS, "compile"), "for a translation model",
                   f"{args.model} is a language model, whose prompt is walked through as it is")
    wanted = _steps(args.step, LM_STEPS, "1..9, 3a, 3b, 3c")
    generator = load_language_model(args.model, decoding_options(args))
    ids = prompt_ids(generator, args.sentence)
    w = walk_lm(generator.model, ids, token_shower(generator.tokenizer), generator.decoding)
    return _print_walk(w, wanted, args.json, to_dict, format_text, {"prompt": args.sentence},
                       f"prompt: {args.sentence!r} ({len(ids)} tokens)\n")


def _print_walk(w, wanted, as_json: bool, to_dict, format_text, header: dict, header_text: str) -> int:
    """Either walk's steps (only the ``wanted`` ones, if given) as JSON or as text under its header."""
    import json

    if wanted is not None:
        w.steps = [s for s in w.steps if s.number in wanted]
    if as_json:
        print(json.dumps({**header, **to_dict(w)}, ensure_ascii=False, indent=1))
    else:
        print(header_text)
        print(format_text(w))
    return 0


def _training(args: argparse.Namespace) -> int:
    import json

    from ..errors import UserError
    from ..viz.walkthrough_training import explain_update, format_update

    if args.sentence is not None:
        raise UserError("--training explains an update on the run's own training batch; give no sentence with it")
    refuse_options(args, ("step", "target", *DECODING), "for the walk of a sentence through the model",
                   "--training explains one update on the run's own batch, on the CPU")
    update = explain_update(args.model, args.matrix, args.lr, args.from_init)
    if args.json:
        print(json.dumps(update.numbers, ensure_ascii=False, indent=1))
    else:
        print(format_update(update), end="")
    return 0


STEPS = ["1", "2", "3a", "3b", "3c", "4", "5", "6", "7", "8", "9", "10"]


def _steps(asked: list[str] | None, steps: list[str], choices: str) -> set[str] | None:
    from ..errors import UserError

    if not asked:
        return None
    wanted = set()
    for a in asked:
        a = a.strip().lower()
        found = {s for s in steps if s == a or (a == "3" and s.startswith("3"))}
        if not found:
            raise UserError(f"--step {a}: no such step; choose from {choices}")
        wanted |= found
    return wanted
