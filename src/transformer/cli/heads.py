"""``transformer heads``: which attention heads carry a prediction. For every head (layer x head;
a translation model's encoder, decoder self- and cross-attention), the change of a score of the
output when that head is ablated (its output before W_O set to 0, or with ``--ablate mean`` to
its mean over the positions) or, with ``--corrupt SENTENCE2``, patched in from the corrupted
sentence. The score is the log-probability of the chosen output (a translation: the whole
translation, teacher-forced; a language model: its next token, or ``--target``'s tokens), or
with ``--token T [--vs U]`` log p(T) - log p(U) where the output has T or U. All heads are
measured in a few batched passes. Prints a table per kind; ``--out FILE.png`` draws the map and
``--json`` prints it as JSON."""
from __future__ import annotations

import argparse
from pathlib import Path

from ._inspect import add_input_options, check_layer, head_labels, load_subject, other_input
from ._options import add_decoding_options, decoding_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("heads", help="how much each attention head carries a prediction: ablate it, or patch it "
                                     "in from a corrupted sentence")
    add_input_options(p)
    p.add_argument("--corrupt", metavar="SENTENCE2", help="patch each head's output in from this sentence "
                                                          "(e.g. 'too tired' -> 'too wide') instead of ablating it")
    p.add_argument("--ablate", choices=["zero", "mean"], help="how a head is ablated: its output 0 (default), or "
                                                              "its mean over the positions")
    p.add_argument("--token", metavar="T", help="score log p(T) where the output has T (or --vs's U) ...")
    p.add_argument("--vs", metavar="U", help="... minus log p(U) there (e.g. --token es --vs sie)")
    p.add_argument("--layer", type=int, help="measure only this layer's heads, from 1")
    p.add_argument("--out", help="draw the map (layers x heads per kind) to this PNG")
    p.add_argument("--json", action="store_true", help="print the map as JSON")
    add_decoding_options(p, "device")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UserError

    if args.out is not None and Path(args.out).suffix.lower() != ".png":
        raise UserError(f"--out {args.out}: the map is drawn as a PNG; name it .png")
    if args.corrupt is not None and args.ablate is not None:
        raise UserError("--ablate is for ablation; --corrupt patches each head in from the corrupted sentence "
                        "instead (remove one)")
    if args.vs is not None and args.token is None:
        raise UserError("--vs needs --token, e.g. --token es --vs sie")
    subject = load_subject(args, args.sentence, args.target, decoding_options(args))
    layer = check_layer(args.layer, max(subject.model.cfg.n_layers, len(subject.model.decoder.layers)))
    score, what = _score(subject, args)
    corrupt = None if args.corrupt is None else other_input(subject, args, args.corrupt, "--corrupt")
    found = _measure(subject, score, args.ablate or ("patch" if corrupt else "zero"), corrupt, layer)
    if args.json:
        _print_json(subject, found, what, layer)
    else:
        _print_table(subject, found, what, layer)
    if args.out is not None:
        from ..viz.causal_maps import draw_heads
        from ..viz.heatmap import save_png

        labels = head_labels(subject)
        how = {"zero": "ablated (0)", "mean": "ablated (mean)", "patch": f"patched from {args.corrupt!r}"}[found.mode]
        save_png(draw_heads(found.effects, labels, f"{what}: change when a head is {how}"), args.out)
        print(f"wrote {args.out}")
    return 0


def _score(subject, args):
    """The Score and a line saying what it is."""
    from ._inspect import score_of

    return score_of(subject, args.token, args.vs, args.target)


def _measure(subject, score, mode: str, corrupt, layer: int | None):
    from ..inspect import head_effects

    found = head_effects(subject.model, subject.inputs, score, ablate=mode, corrupt=corrupt,
                         layers=None if layer is None else [layer], **subject.options())
    if layer is not None:  # the one layer measured
        found.effects = {k: t[layer:layer + 1] for k, t in found.effects.items() if layer < t.size(0)}
    return found


def _print_table(subject, found, what: str, layer: int | None) -> None:
    print(subject.header())
    line = f"score: {what} = {found.clean:.4f}"
    if found.corrupt is not None:
        line += f"; on the corrupted sentence {found.corrupt:.4f}"
    print(line)
    print({"zero": "change when the head's output is 0:", "mean": "change when the head's output is its mean:",
           "patch": "change when the head's output is patched in from the corrupted sentence:"}[found.mode])
    labels = head_labels(subject)
    first = 0 if layer is None else layer
    for kind, table in found.effects.items():
        print(f"  {labels[kind]} (rows: layers, columns: heads)")
        print("          " + "".join(f"{'head ' + str(h + 1):>9}" for h in range(table.size(1))))
        for i, row in enumerate(table.tolist()):
            print(f"  layer {first + i + 1:<3}" + "".join(f"{v:>9.3f}" for v in row))
    for kind, why in found.skipped.items():
        print(f"  {labels[kind]}: not patched ({why})")
    ranked = sorted(((abs(float(v)), float(v), kind, i, h) for kind, t in found.effects.items()
                     for i, row in enumerate(t) for h, v in enumerate(row)), reverse=True)[:5]
    print("largest: " + "; ".join(f"{labels[k]} layer {first + i + 1} head {h + 1}: {v:+.3f}"
                                  for _, v, k, i, h in ranked))


def _print_json(subject, found, what: str, layer: int | None) -> None:
    import json

    labels = head_labels(subject)
    print(json.dumps({"sentence": subject.sentence, "translation": subject.translation, "score": what,
                      "mode": found.mode, "clean": found.clean, "corrupt": found.corrupt,
                      "first_layer": 1 if layer is None else layer + 1,
                      "effects": {labels[k]: [[round(float(v), 6) for v in row] for row in t]
                                  for k, t in found.effects.items()},
                      "skipped": {labels[k]: why for k, why in found.skipped.items()}}, ensure_ascii=False, indent=1))
