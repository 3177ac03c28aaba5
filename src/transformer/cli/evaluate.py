"""``transformer evaluate``: translate a test set and score it with sacreBLEU and chrF; or,
with ``--text``, score a language model on a text (cross-entropy, perplexity, bits per byte;
see transformer/evaluation/lm.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ._options import (add_shortlist_from, shortlist_pairs, SEARCH_OPTIONS, add_decoding_options, decoding_options, prepare_compiled, refuse_options,
                       refuse_output_over_inputs)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="translate --src and score against --ref (sacreBLEU, chrF); or score a "
                                        "language model on --text (cross-entropy, perplexity, bits per byte)")
    p.add_argument("--model", required=True, nargs="+", action="extend",
                   help="run directory or .safetensors file; several (after one --model, or --model repeated): "
                        "an ensemble (the run's config is the first one's)")
    p.add_argument("--src", help="source file, one sentence a line (.gz allowed)")
    p.add_argument("--ref", help="reference translations, untouched (.gz allowed)")
    p.add_argument("--split", help="instead of --src/--ref: a split of the run's dataset, e.g. test_2016_flickr "
                                   "(languages from the run's config.yaml)")
    p.add_argument("--tgt-lang", help="target language (e.g. de) for the lower-cased Moses-tokenised BLEU; "
                                      "default: tgt_lang of the run's config.yaml, and without one it is not computed")
    p.add_argument("--data-dir", help="folder holding multi30k/ (default: $TRANSFORMER_DATA, else "
                                      "~/.cache/transformer/data)")
    p.add_argument("--limit", type=int, help="score only the first N sentences (0 = all; default: all)")
    p.add_argument("--output", help="also write the translations here")
    p.add_argument("--text", metavar="FILE",
                   help="a language model: score this UTF-8 text, .gz allowed (cross-entropy in nats per token, "
                        "perplexity, bits per byte), in windows of the model's context; fp32 unless --precision "
                        "is given; --max-tokens counts window tokens per forward pass")
    p.add_argument("--stride", type=int, metavar="N",
                   help="with --text: each window after the first scores the next N tokens, seeing at least "
                        "context - N tokens before each (1 .. context-1; default: half the context; "
                        "context-1: windows that share one token, the fastest)")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    add_decoding_options(p, "beam", "alpha", "max_tokens", "precision", "device", "compile", "shortlist")
    add_shortlist_from(p)
    p.set_defaults(func=run, memory_remedy="lower --beam, or --max-tokens (the source tokens decoded together)")


def run(args: argparse.Namespace) -> int:
    from ..data import read_lines
    from ..errors import UserError
    from ..evaluation.translation import score
    from ..inference.front_door import run_decoding
    from ..hardware import device_line
    from ..run import read_model_config
    from ..run.files import write_output
    from ..inference.translator import load_translator
    from ._progress import line_progress
    from .translate import report_truncated

    if args.text is not None:
        return run_text(args)
    refuse_options(args, ("stride",), "for --text (scoring a language model)",
                   "--src and --ref, or --split, score a translation model")
    if not args.split:
        refuse_options(args, ("data_dir",), "for --split (the folder holding multi30k/)",
                       "--src and --ref are read as they are")
    if args.output:
        refuse_output_over_inputs(args.output, {"--src": args.src, "--ref": args.ref}, args.model)
    decoding = run_decoding(args.model[0], decoding_options(args))  # before the slow part: fail fast
    if read_model_config(args.model[0]).decoder_only:
        raise UserError(f"{args.model[0]}: a language model; score it on a text with --text FILE")
    run_config = None  # the run's config.yaml, read once when something needs it
    if args.split:
        if args.src or args.ref:
            raise UserError("give either --split or --src and --ref, not both")
        src, ref, run_config = _split_pairs(args)
        args.src, args.ref = f"{args.split}.src", f"{args.split}.ref"
    elif args.src and args.ref:
        src, ref = read_lines(args.src), read_lines(args.ref)
    else:
        raise UserError("give --src and --ref files, or --split (e.g. --split test_2016_flickr); "
                        "a language model: --text FILE")
    if args.limit is not None and args.limit < 0:
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
    translator = load_translator(args.model, warn=False, shortlist_pairs=shortlist_pairs(args), **decoding.to_dict())
    prepare_compiled(translator)
    decoding = translator.decoding  # precision auto resolved for this machine
    t0 = time.perf_counter()
    with line_progress(len(src)) as done:  # drawn only when stderr is a terminal
        hyps = translator.translate(src, progress=done)
    report_truncated(translator)
    seconds = time.perf_counter() - t0
    scores = score(hyps, ref, lang=lang)
    if args.output:
        write_output(args.output, lambda f: f.write("".join(h + "\n" for h in hyps)))
    lowercase = translator.subwords.lowercases
    if args.json:
        print(json.dumps({**scores.to_dict(), "beam": decoding.beam, "alpha": decoding.alpha,
                          "precision": decoding.precision, "device": device_line(translator.device), "seconds": seconds,
                          "model": args.model[0] if len(args.model) == 1 else args.model,
                          "lowercase_model": lowercase}))
    else:
        print(scores.summary())
        if lowercase:
            print("this model writes lower-case text (trained with lowercase: true): "
                  "compare its lower-cased figures; the cased BLEU counts every capital as an error")
        print(f"beam {decoding.beam}, alpha {decoding.alpha}, {decoding.precision}, on {device_line(translator.device)}, "
              f"{len(src)} sentences in {seconds:.1f}s")
    return 0


def run_text(args: argparse.Namespace) -> int:
    """``--text``: a language model's cross-entropy, perplexity and bits per byte on a text."""
    from ..data.text import read_text
    from ..errors import UserError
    from ..evaluation.lm import score_text
    from ..inference.front_door import run_decoding
    from ..inference.generator import Generator
    from ..hardware import device_line, slow_precision_warning
    from ..run import read_model_config

    refuse_options(args, ("src", "ref", "split", "data_dir", "tgt_lang", "limit", "output", "shortlist_from",
                          *SEARCH_OPTIONS),
                   "for translation", "--text scores a language model")
    refuse_options(args, ("compile",), "for decoding (a search, token by token)",
                   "--text scores a language model in one forward pass per window")
    if len(args.model) > 1:
        raise UserError("--text scores one model; give one --model")
    path, options = args.model[0], decoding_options(args)
    options["precision"] = options.get("precision", "fp32")
    run_decoding(path, options)  # before the slow part: fail fast
    text = read_text(args.text, "score")
    if not read_model_config(path).decoder_only:
        raise UserError(f"{path}: a translation model; --text scores a language model "
                        "(score a translation model with --src and --ref, or --split)")
    # the model, its tokenizer and settings as generate opens them (transformer/inference/front_door.py)
    generator = Generator.from_pretrained(path, warn=False, **options)
    decoding = generator.decoding  # precision auto resolved for this machine
    if note := slow_precision_warning(generator.requested_precision, decoding.device):
        print(f"warning: {note}", file=sys.stderr, flush=True)
    context = generator.model.cfg.max_len
    if args.stride is not None and not 1 <= args.stride <= context - 1:
        raise UserError(f"--stride must be between 1 and the model's context minus one ({context - 1}), "
                        f"got {args.stride}")
    t0 = time.perf_counter()
    scores = score_text(generator.model, generator.tokenizer, text, args.stride, decoding.max_tokens, args.text)
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({**scores.to_dict(), "precision": decoding.precision,
                          "device": device_line(generator.device), "seconds": seconds,
                          "model": args.model[0], "text": args.text}))
    else:
        print(scores.summary())
        print(f"{decoding.precision}, on {device_line(generator.device)}, {seconds:.1f}s")
    return 0


def _split_pairs(args) -> tuple[list[str], list[str], dict]:
    """Source and reference lines of a registry split, in the languages of the run, and the
    run's config."""
    from ..data import load_multi30k
    from ..errors import UserError, shown

    run = _run_config(args.model[0])
    if not run:
        raise UserError(f"{args.model[0]}: --split needs a model inside a run directory with config.yaml "
                        "(to know the languages)")
    if run.get("dataset") != "multi30k":
        named = f"dataset is {shown(run['dataset'])}" if run.get("dataset") else "config names no dataset"
        raise UserError(f"{args.model[0]}: the run's {named}; --split works for "
                        "dataset multi30k: give --src and --ref for other data")
    pairs = load_multi30k(args.split, run["src_lang"], run["tgt_lang"], data_dir=args.data_dir or run.get("data_dir"))
    return [s for s, _ in pairs], [t for _, t in pairs], run


def _run_config(model: str) -> dict:
    """The config.yaml of the run that ``--model`` belongs to; {} when there is none."""
    from ..run import read_run_config

    return read_run_config(model)
