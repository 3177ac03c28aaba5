"""``transformer attention``: heatmaps of every attention weight for one sentence (or, for a
language model, the causal self-attention of a prompt), and the heads that link one word to
another (the article's "it" -> "animal"). ``--beam`` and ``--compile`` choose how the translation
is searched for; an option the command, as asked, does not use (``--beam`` with ``--target`` or
for a language model, whose prompt is one forward pass; ``--layer`` without a PNG to draw) is a
one-line error."""
from __future__ import annotations

import argparse
from pathlib import Path

from ._options import SEARCH_OPTIONS, add_decoding_options, decoding_options, prepare_compiled, refuse_options

PICTURE = ("layer", "head", "kind")  # the PNG's: the HTML page lets its reader choose them


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="draw the attention weights of one sentence and its translation "
                                         "(or of a language model's prompt)")
    p.add_argument("sentence", help="the source sentence (translation model) or the prompt (language model)")
    p.add_argument("--model", required=True, help="run directory or .safetensors file")
    p.add_argument("--out", help="picture to write: PNG, or HTML with --html (or a .html name)")
    p.add_argument("--html", action="store_true", help="write a self-contained HTML page instead of a PNG")
    p.add_argument("--layer", type=int, help="the PNG's enlarged head's layer, from 1 (default: the last)")
    p.add_argument("--head", type=int, help="the PNG's enlarged head, from 1 (default: 1)")
    p.add_argument("--kind", choices=["all", "encoder", "decoder", "cross", "self"],
                   help="which attention to draw in the PNG (default: all three; a language model has only "
                        "self, its causal self-attention)")
    p.add_argument("--target", help="use this translation instead of the model's own")
    p.add_argument("--focus", metavar="WORD", help="rank the encoder heads (a language model: the self-attention "
                                                   "heads, from WORD's last token) by attention from WORD ...")
    p.add_argument("--to", metavar="WORD", help="... to this WORD (e.g. --focus it --to animal)")
    p.add_argument("--vs", metavar="WORD", help="... and show the attention to this WORD beside it (e.g. --vs street)")
    add_decoding_options(p, "beam", "compile", "device")
    p.set_defaults(func=run)


def _check(args) -> None:
    from ..errors import UserError

    if not args.sentence.strip():
        raise UserError("the sentence is empty; give some text to look at")
    if args.out is None and args.focus is None:
        raise UserError("nothing to do: give --out FILE (a picture) and/or --focus WORD --to WORD (a table)")
    if (args.focus is None) != (args.to is None):
        raise UserError("--focus and --to go together, e.g. --focus it --to animal")
    if args.vs is not None and args.focus is None:
        raise UserError("--vs needs --focus and --to, e.g. --focus it --to animal --vs street")
    if args.html and args.out is None:
        raise UserError("--html needs --out FILE")
    suffix = Path(args.out).suffix.lower() if args.out is not None else ""
    if not args.html and suffix not in ("", ".png", ".html", ".htm"):
        raise UserError(f"--out {args.out}: the picture is a PNG; name it .png (or .html, or give --html, "
                        "for the HTML page)")
    if args.out is None:
        refuse_options(args, PICTURE, "for the picture (--out FILE.png)", "without --out only the table is printed")
    elif args.html or suffix in (".html", ".htm"):
        refuse_options(args, PICTURE, "for the PNG picture", "the HTML page lets its reader pick the kind, "
                       "layer and head")
    args.head = 1 if args.head is None else args.head  # the defaults, once a given option is told from one left out
    args.kind = args.kind or "all"


def _check_head(args, cfg) -> tuple[int, int]:
    """The enlarged head's (layer, head), from 0."""
    from ..errors import UserError

    layer = cfg.n_layers if args.layer is None else args.layer
    if not 1 <= layer <= cfg.n_layers:
        raise UserError(f"--layer {layer} is out of range: the model has {cfg.n_layers} layers (1..{cfg.n_layers})")
    if not 1 <= args.head <= cfg.n_heads:
        raise UserError(f"--head {args.head} is out of range: the model has {cfg.n_heads} heads (1..{cfg.n_heads})")
    return layer - 1, args.head - 1


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError
    from ..run import read_model_config
    from ..inference.translator import load_translator
    from ..viz.maps import KINDS, collect_attention, format_links, prepare_pair, rank_heads

    _check(args)
    if read_model_config(args.model).decoder_only:
        return _language_model(args)
    if args.kind == "self":
        raise UserError("--kind self is a language model's attention; a translation model has encoder, "
                        "decoder and cross")
    if args.target is not None:
        refuse_options(args, (*SEARCH_OPTIONS, "compile"), "for the search of the model's own translation",
                       "--target gives the translation")
    translator = load_translator(args.model, **{**decoding_options(args), "precision": "fp32"})  # the exact arithmetic shown
    layer, head = _check_head(args, translator.model.cfg)
    if args.target is None:  # the model's own translation is searched for (--compile: how)
        prepare_compiled(translator)
    pair = prepare_pair(translator, args.sentence, args.target)
    maps = collect_attention(translator.model, pair, translator.subwords.id_to_piece)
    print(f"translation: {pair.translation}")
    if args.focus is not None:
        links = rank_heads(maps, args.focus, args.to, args.vs)
        print(format_links(links, args.focus, args.to, len(maps.src_pieces), args.vs))
    if args.out is None:
        return 0
    kinds = KINDS if args.kind == "all" else (args.kind,)
    return _write(maps, args, layer, head, kinds)


def _language_model(args: argparse.Namespace) -> int:
    """A prompt's causal self-attention: all layers and heads, one head enlarged."""
    from ..errors import UserError
    from ..viz.maps import collect_prompt_attention, find_word, format_links, rank_heads
    from ._lm import load_language_model, prompt_ids, token_pieces

    if args.kind not in ("all", "self"):
        raise UserError(f"--kind {args.kind}: a language model has only causal self-attention (--kind self)")
    refuse_options(args, ("target", *SEARCH_OPTIONS, "compile"), "for a translation model",
                   f"{args.model} is a language model, whose prompt is read as it is")
    generator = load_language_model(args.model, decoding_options(args))
    layer, head = _check_head(args, generator.model.cfg)
    ids = prompt_ids(generator, args.sentence)
    maps = collect_prompt_attention(generator.model, args.sentence, ids, token_pieces(generator, ids))
    print(f"prompt: {len(ids)} tokens")
    if args.focus is not None:
        links = rank_heads(maps, args.focus, args.to, args.vs)
        keys = find_word(maps.pieces, args.focus)[-1] + 1  # the query sees itself and the tokens before it
        print(format_links(links, args.focus, args.to, keys, args.vs, heads="self-attention"))
    if args.out is None:
        return 0
    return _write(maps, args, layer, head, ("self",))


def _write(maps, args: argparse.Namespace, layer: int, head: int, kinds: tuple[str, ...]) -> int:
    if args.html or args.out.lower().endswith((".html", ".htm")):
        from ..viz.html import write_html

        write_html(maps, args.out)
    else:
        from ..viz.heatmap import draw_attention, save_png

        save_png(draw_attention(maps, layer, head, kinds), args.out)
    print(f"wrote {args.out}")
    return 0
