"""``transformer lens``: the logit lens of one sentence. For every layer and position, what the
model would predict if it stopped after that layer (the residual stream through the final norm
and the output projection): the top tokens and the probability of the token finally chosen.
A translation model is read on its decoder, teacher-forced on the translation (``--target``, or
its own greedy one); a language model on the text. ``--out FILE.png`` draws it (layers x
positions, coloured by the probability of the final choice, the top token in each cell)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ._inspect import add_input_options, check_layer, load_subject
from ._options import add_decoding_options, decoding_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lens", help="the logit lens: what the model would predict after each layer, "
                                    "at each position of one sentence")
    add_input_options(p)
    p.add_argument("--out", help="draw the lens to this PNG (layers x positions)")
    p.add_argument("--layer", type=int, help="print only this layer, from 1 (0: the embeddings)")
    p.add_argument("--top", type=int, default=3, metavar="K", help="tokens printed per layer and position "
                                                                   "(default 3)")
    p.add_argument("--json", action="store_true", help="print the lens as JSON")
    add_decoding_options(p, "device")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from ..errors import UserError
    from ..inspect import logit_lens

    if args.out is not None and Path(args.out).suffix.lower() != ".png":
        raise UserError(f"--out {args.out}: the lens is drawn as a PNG; name it .png")
    if not 1 <= args.top <= 20:
        raise UserError(f"--top {args.top}: give 1 to 20 tokens")
    subject = load_subject(args, args.sentence, args.target, decoding_options(args))
    n_layers = len(subject.model.decoder.layers)
    rows = None
    if args.layer is not None:
        rows = [0] if args.layer == 0 else [check_layer(args.layer, n_layers) + 1]
    lens = logit_lens(subject.model, *subject.inputs, **subject.options())
    rows = list(range(len(lens.layers))) if rows is None else rows
    probs, ids = lens.top(args.top)
    chosen_prob = lens.chosen_prob
    show = subject.show
    chosen = [show(int(i)) for i in lens.chosen]
    if args.json:
        layers = [{"layer": lens.layers[r], "final_choice_prob": [round(float(p), 5) for p in chosen_prob[r]],
                   "top": [[[show(int(i)), round(float(q), 5)] for i, q in zip(ids[r, t], probs[r, t])]
                           for t in range(len(subject.pieces))]} for r in rows]
        print(json.dumps({"sentence": subject.sentence, "translation": subject.translation, "positions": subject.pieces,
                          "final_choice": chosen, "layers": layers}, ensure_ascii=False, indent=1))
    else:
        print(subject.header())
        print(_table(lens.layers, rows, subject.pieces, chosen, chosen_prob, ids, probs, show))
    if args.out is not None:
        from ..viz.causal_maps import draw_lens
        from ..viz.heatmap import save_png

        top1 = [[show(int(i)) for i in ids[r, :, 0]] for r in range(len(lens.layers))]
        title = f"logit lens: {subject.sentence}" + (f" -> {subject.translation}" if subject.translation else "")
        save_png(draw_lens(lens.layers, subject.pieces, chosen, chosen_prob.numpy(), top1, title), args.out)
        print(f"wrote {args.out}")
    return 0


def _table(layers, rows, pieces, chosen, chosen_prob, ids, probs, show) -> str:
    """One block per position: what it reads, the final choice, then each layer's probability
    of that choice and its top tokens."""
    out = []
    for t, piece in enumerate(pieces):
        out.append(f"position {t + 1} reads {piece!r}, final choice {chosen[t]!r}:")
        for r in rows:
            tops = ", ".join(f"{show(int(i))} {float(q):.3f}" for i, q in zip(ids[r, t], probs[r, t]))
            out.append(f"  {'layer ' + layers[r] if layers[r] != 'embed' else 'embed':>9}  "
                       f"p(final) {float(chosen_prob[r, t]):.3f}   top: {tops}")
    return "\n".join(out)
