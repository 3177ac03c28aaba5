"""``transformer info``: what a trained model is made of. For a language model, the article's
list of matrices: We and Whead, and per layer WQ, WK, WV, WO, W_gate, W_up, W_down, with
their shapes and parameter counts; for a translation model, every parameter tensor. Then how
decoding it on this CPU multiplies: what ``--precision auto`` picks and the int8 kernel of
each layer's shape, with the rates measured (:mod:`transformer.decode.choose`)."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="list a model's weight matrices with their shapes and parameter counts")
    p.add_argument("--model", required=True, help="run directory or .safetensors file")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def rows(model) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(name, parameter, shape, count) for every matrix of ``model``."""
    from ..viz.matrices import weight_matrices

    if model.cfg.decoder_only:
        return weight_matrices(model)
    return [(name, name, tuple(p.shape), p.numel()) for name, p in model.named_parameters()]


def others(model) -> list[tuple[str, int]]:
    """(group, count) of a language model's parameters outside :func:`rows`' matrices: the
    norms' gains (and LayerNorm's biases), Qwen2's q/k/v biases, the matrices' biases, an
    output bias; they and the matrices add up to the model's parameter count."""
    listed = {param for _, param, _, _ in rows(model)}
    norm = "RMSNorm" if model.cfg.norm == "rms" else "LayerNorm"
    groups: dict[str, int] = {}
    for name, p in model.named_parameters():
        if name in listed:
            continue
        if ".norm." in name or name.startswith("norm."):
            group = f"{norm} gains" if name.endswith("weight") else f"{norm} biases"
        elif name.endswith("_proj.bias") and ".self_attn." in name and not model.cfg.bias:
            group = "q/k/v biases"  # Qwen2: biases on these three projections only
        elif name.endswith("bias"):
            group = "output bias" if "." not in name else "matrix biases"
        else:
            group = name
        groups[group] = groups.get(group, 0) + p.numel()
    return list(groups.items())


def decoding_lines(report: dict) -> list[str]:
    """:func:`transformer.decode.choose.report` as the lines ``info`` prints: per shape, each
    candidate's rate in multiply-adds per second (GMAC/s), the int8 kernel chosen and whether
    fp32 and bf16 multiply through ``F.linear`` or oneDNN's linear."""
    rows = report["rows"]
    how = (f"measured on one thread at {' and '.join(map(str, rows))} rows" if report["source"] == "measured"
           else "chosen by the CPU's flags (nothing measured)")
    lines = [f"decoding on this CPU ({report['machine']}), {how}:", f"  precision auto: {report['auto']}"]
    for entry in report["shapes"]:
        d_in, d_out = (int(n) for n in entry["shape"].split("x"))
        rates = "" if entry["seconds"] is None else "  " + ", ".join(
            f"{name} {d_in * d_out * sum(rows) / s / 1e9:.1f}" if s else f"{name} cannot run"
            for name, s in entry["seconds"].items())
        lines.append(f"  {entry['shape']:>11}: int8 kernel {entry['int8']}, fp32 {entry['fp32']}, bf16 {entry['bf16']}"
                     f"{rates and ';  GMAC/s:' + rates}")
    return lines


def run(args: argparse.Namespace) -> int:
    import json

    from ..decode.choose import report
    from ..run import load_model

    model, meta = load_model(args.model)
    cfg, table = model.cfg, rows(model)
    total = model.num_parameters()
    rest = others(model) if cfg.decoder_only else []
    decoding = report(model)
    if args.json:
        print(json.dumps({"weights": meta["path"], "config": cfg.to_dict(), "parameters": total,
                          "matrices": [{"name": n, "parameter": p, "shape": list(s), "count": c} for n, p, s, c in table],
                          "others": [{"name": n, "count": c} for n, c in rest], "decoding": decoding}))
        return 0
    family = "decoder-only language model" if cfg.decoder_only else "encoder-decoder translation model"
    print(f"{meta['path']}: {family}, {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads"
          f"{f' ({cfg.kv_heads} K/V heads)' if cfg.kv_heads != cfg.n_heads else ''}, d_ff {cfg.d_ff}, "
          f"vocabulary {cfg.vocab_size}, context {cfg.max_len}; {total:,} parameters")
    width = max(len(n) for n, *_ in table)
    for name, param, shape, count in table:
        shown = " x ".join(map(str, shape))
        print(f"  {name:<{width}}  {shown:>12}  {count:>12,}  {param}")
    matrices = sum(c for *_, c in table)
    if cfg.decoder_only:
        print(f"  the matrices above hold {matrices:,} of the {total:,} parameters; the rest are "
              + ", ".join(f"{name} ({count:,})" for name, count in rest))
    print("\n".join(decoding_lines(decoding)))
    return 0
