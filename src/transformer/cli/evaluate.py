"""``transformer evaluate``: translate a test set and score it with sacreBLEU and chrF."""
from __future__ import annotations

import argparse
import json
import time

from ._options import add_decoding_options, decoding_options, prepare_compiled


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="translate --src and score against --ref (sacreBLEU, chrF)")
    p.add_argument("--model", required=True, nargs="+",
                   help="run directory or .safetensors file; several: an ensemble (the run's config is the first one's)")
    p.add_argument("--src", help="source file, one sentence a line (.gz allowed)")
    p.add_argument("--ref", help="reference translations, untouched (.gz allowed)")
    p.add_argument("--split", help="instead of --src/--ref: a split of the run's dataset, e.g. test_2016_flickr "
                                   "(languages from the run's config.yaml)")
    p.add_argument("--tgt-lang", help="target language (e.g. de) for the lower-cased Moses-tokenised BLEU; "
                                      "default: tgt_lang of the run's config.yaml, and without one it is not computed")
    p.add_argument("--data-dir", help="folder holding multi30k/ (default: $TRANSFORMER_DATA)")
    p.add_argument("--limit", type=int, default=0, help="score only the first N sentences (0 = all)")
    p.add_argument("--output", help="also write the translations here")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    add_decoding_options(p, "beam", "alpha", "max_tokens", "precision", "device", "compile")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..data import read_lines
    from ..errors import UserError
    from ..evaluate import score
    from ..run.files import write_text_atomic
    from ..translator import load_translator, run_decoding
    from ._progress import line_progress
    from .translate import report_truncated

    decoding = run_decoding(args.model[0], decoding_options(args))  # before the slow part: fail fast
    run_config = None  # the run's config.yaml, read once when something needs it
    if args.split:
        if args.src or args.ref:
            raise UserError("give either --split or --src and --ref, not both")
        src, ref, run_config = _split_pairs(args)
        args.src, args.ref = f"{args.split}.src", f"{args.split}.ref"
    elif args.src and args.ref:
        src, ref = read_lines(args.src), read_lines(args.ref)
    else:
        raise UserError("give --src and --ref files, or --split (e.g. --split test_2016_flickr)")
    if args.limit < 0:
        raise UserError(f"--limit must not be negative, got {args.limit}")
    if len(src) != len(ref):
        raise UserError(f"{args.src} has {len(src)} lines but {args.ref} has {len(ref)}; they must be aligned")
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    if not src:
        raise UserError(f"{args.src}: no sentences to score (the files are empty)")
    if not args.tgt_lang and run_config is None:
        run_config = _run_config(args.model[0])  # before the slow part: fail fast
    lang = args.tgt_lang or run_config.get("tgt_lang")
    translator = load_translator(args.model, warn=False, **decoding.to_dict())
    prepare_compiled(translator)
    decoding = translator.decoding  # precision auto resolved for this machine
    t0 = time.perf_counter()
    with line_progress(len(src)) as done:  # drawn only when stderr is a terminal
        hyps = translator.translate(src, progress=done)
    report_truncated(translator)
    seconds = time.perf_counter() - t0
    scores = score(hyps, ref, lang=lang)
    if args.output:
        write_text_atomic(args.output, "".join(h + "\n" for h in hyps))
    lowercase = translator.subwords.lowercases
    if args.json:
        print(json.dumps({**scores.to_dict(), "beam": decoding.beam, "alpha": decoding.alpha,
                          "precision": decoding.precision, "seconds": seconds,
                          "model": args.model[0] if len(args.model) == 1 else args.model,
                          "lowercase_model": lowercase}))
    else:
        print(scores.summary())
        if lowercase:
            print("this model writes lower-case text (trained with lowercase: true): "
                  "compare its lower-cased figures; the cased BLEU counts every capital as an error")
        print(f"beam {decoding.beam}, alpha {decoding.alpha}, {decoding.precision}, "
              f"{len(src)} sentences in {seconds:.1f}s")
    return 0


def _split_pairs(args) -> tuple[list[str], list[str], dict]:
    """Source and reference lines of a registry split, in the languages of the run, and the
    run's config."""
    from ..data import load_multi30k
    from ..errors import UserError

    run = _run_config(args.model[0])
    if not run:
        raise UserError(f"{args.model[0]}: --split needs a model inside a run directory with config.yaml "
                        "(to know the languages)")
    if run.get("dataset") != "multi30k":
        raise UserError(f"{args.model[0]}: the run's dataset is {run.get('dataset')!r}; --split works for "
                        "dataset multi30k: give --src and --ref for other data")
    pairs = load_multi30k(args.split, run["src_lang"], run["tgt_lang"], data_dir=args.data_dir or run.get("data_dir"))
    return [s for s, _ in pairs], [t for _, t in pairs], run


def _run_config(model: str) -> dict:
    """The config.yaml of the run that ``--model`` belongs to; {} when there is none."""
    from ..run import read_run_config

    return read_run_config(model)
