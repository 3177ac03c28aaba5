"""Where ours spends a real-size translation's time, by part of the work, at each precision:
the model of ``real_size.py`` (its ``--work`` folder), the first ``--n`` test sentences in
``transformer translate``'s batches, beam 4, after one untimed pass.

Parts are marked without touching the model's code: torch.profiler ranges around the
instance's ``encode``, ``start_cache``, ``decode`` and ``project`` (the output projection), each
decoder attention's ``project_qkv`` / ``forward`` / ``attend`` (self and cross), each FFN and
each norm. Every top-level operator's time goes to the innermost part around it; within an
attention, by operator (the products, the fused-weight ``cat``, the attention kernel, the rest).
Operators outside ``decode`` are the search's own (log-softmax, top-k, the cache reorder:
"beam search"); the wall time that no operator accounts for is Python and dispatch
("per-step overhead").

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/real_size_split.py --work DIR \\
        [--precisions bf16,fp32] [--n 64] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from transformer import hardware

PRODUCTS = {"aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul", "aten::_weight_int8pack_mm",
            "aten::mkldnn_rnn_layer", "quantized::linear_dynamic", "aten::_int_mm"}
ATTENTION = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_attention_math", "aten::softmax", "aten::_softmax"}


class Marks:
    """profiler ranges around methods of an instance (a wrapper in its ``__dict__``) and around
    modules' forwards (hooks)."""

    def __init__(self):
        self.stack = []

    def method(self, obj, name: str, label: str) -> None:
        if name in vars(obj):  # an instance's own (a decoding copy's projection): wrapped there
            original = vars(obj)[name]

            def marked(*args, **kwargs):
                with record_function(label):
                    return original(*args, **kwargs)

            setattr(obj, name, marked)
            return
        cls = type(obj)  # a class's method: wrapped in a subclass, so that a copy of the object
        original = getattr(cls, name)  # (the eager step's, without its projection) runs its own

        def marked_method(self_, *args, **kwargs):
            with record_function(label):
                return original(self_, *args, **kwargs)

        obj.__class__ = type(cls.__name__, (cls,), {name: marked_method})

    def module(self, module: torch.nn.Module, label: str) -> None:
        def enter(mod, args):
            rf = record_function(label)
            rf.__enter__()
            self.stack.append(rf)

        def leave(mod, args, out):
            self.stack.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)


def mark(model) -> None:
    marks = Marks()
    for name in ("encode", "start_cache", "decode", "project"):
        marks.method(model, name, f"part:{name}")
    for i, layer in enumerate(model.decoder.layers):
        for kind in ("self_attn", "cross_attn"):
            attn = getattr(layer, kind)
            for method in ("project_qkv", "forward", "attend"):
                marks.method(attn, method, f"part:{kind}")
        marks.module(layer.ffn, "part:ffn")
    for name, module in model.decoder.named_modules():
        if "Norm" in type(module).__name__:
            marks.module(module, "part:norm")


def part_of(event) -> str:
    """The part a top-level operator belongs to (module docstring)."""
    labels = []
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("part:"):
            labels.append(parent.name[5:])
        parent = parent.cpu_parent
    if not labels:
        return "beam search (outside the model's step)"
    if "encode" in labels or "start_cache" in labels:
        return "encoder, and the memory's keys and values"
    if "project" in labels:
        return "output projection"
    inner = labels[0]
    if inner in ("self_attn", "cross_attn"):
        what = "self-attention" if inner == "self_attn" else "cross-attention"
        if event.name in PRODUCTS:
            return f"{what}: projections"
        if event.name == "aten::cat":
            return f"{what}: cat (fused q/k/v weights, cache)"
        if event.name in ATTENTION:
            return f"{what}: attention kernel"
        return f"{what}: other"
    if inner == "ffn":
        return "FFN"
    if inner == "norm":
        return "norms"
    return "decoder step: other (embedding, positions, residuals)"


def split(translator, lines: list[str]) -> tuple[dict[str, float], float, dict[str, float]]:
    """(ms by part, wall ms, ms by operator of the search's own part) of one translate()."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        translator.translate(lines)
        wall = (time.perf_counter() - t) * 1e3
    parts: dict[str, float] = defaultdict(float)
    search_ops: dict[str, float] = defaultdict(float)
    for e in prof.events():
        parent = e.cpu_parent
        while parent is not None and parent.name.startswith("part:"):
            parent = parent.cpu_parent
        if e.name.startswith("part:") or parent is not None:  # a mark, or an operator inside another
            continue
        part = part_of(e)
        parts[part] += e.cpu_time_total / 1e3
        if part.startswith("beam search"):
            search_ops[e.name] += e.cpu_time_total / 1e3
    parts["per-step overhead (Python, dispatch: wall time outside operators)"] = wall - sum(parts.values())
    return dict(parts), wall, dict(search_ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="real_size.py's --work folder (its run/ is decoded)")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--n", type=int, default=64, help="test_2016_flickr sentences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    run = Path(args.work) / "run"
    if not (run / "config.yaml").is_file():
        print(f"error: --work {args.work}: no run/ in it; build it with benchmarks/decode/real_size.py --work "
              f"{args.work} first", file=sys.stderr)
        sys.exit(2)
    from transformer.data import load_multi30k
    from transformer.inference.translator import load_translator

    lines = [s for s, _ in load_multi30k("test_2016_flickr", "en", "de", download=False)][: args.n]
    results = {"machine": hardware.describe(), "n": len(lines), "threads": args.threads, "precisions": {}}
    for precision in args.precisions.split(","):
        translator = load_translator(run, warn=False, beam=args.beam, precision=precision, compile="off")
        mark(translator.model)
        translator.translate(lines)  # warm-up
        parts, wall, search_ops = split(translator, lines)
        steps = translator.decoding.max_len_b  # every sentence runs to the limit (real_size.py's model)
        results["precisions"][precision] = {"wall_ms": wall, "parts_ms": parts, "search_ops_ms": search_ops}
        print(f"\n{precision}: {len(lines)} sentences, beam {args.beam}, {args.threads} threads: {wall / 1e3:.1f} s, "
              f"about {wall / steps:.0f} ms a step of the batch\n")
        print("| part | s | share |\n|---|---|---|")
        for part, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"| {part} | {ms / 1e3:.2f} | {ms / wall:.1%} |")
        top = sorted(search_ops.items(), key=lambda kv: -kv[1])[:6]
        print("\nbeam search's operators: " + ", ".join(f"{k.removeprefix('aten::')} {v / 1e3:.2f} s" for k, v in top))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
