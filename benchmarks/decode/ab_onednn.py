"""What the float decoding copy's two changes buy, in one process: the same run decoded by three
Translators that take turns, round after round, each timed in the process's CPU time (what a
shared machine's other work stretches least):

    now          the measured choice: shapes faster through oneDNN's linear multiply there, the
                 attention weights concatenated once (``decode/decoding_copy.py``)
    fused-only   F.linear everywhere, the attention weights concatenated once
    before       F.linear everywhere, the weights concatenated at every call (the path before)

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/ab_onednn.py \\
        --work DIR [--n 32] [--rounds 3] [--precision fp32] [--beam 4]

``--work`` is ``real_size.py``'s folder (its ``run/`` is decoded), or ``--run`` any translation run.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="real_size.py's --work folder")
    ap.add_argument("--run", help="a translation run (instead of --work)")
    ap.add_argument("--n", type=int, default=32, help="test_2016_flickr sentences")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", default="fp32", help="fp32 or bf16")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformer import hardware
    from transformer.data.corpus import read_lines
    from transformer.data.registry import multi30k_path
    from transformer.decode import choose, decoding_copy
    from transformer.inference.translator import load_translator
    from transformer.run.layout import read_run_config

    print(hardware.describe_line(), flush=True)
    run = Path(args.run) if args.run else Path(args.work) / "run"
    lang = read_run_config(run).get("src_lang", "en")
    lines = read_lines(multi30k_path("test_2016_flickr", lang, download=False))[: args.n]
    measured, fuse = choose.onednn_shapes, decoding_copy.DecodingAttention.fuse

    def translator(onednn: bool, fused: bool):
        choose.onednn_shapes = measured if onednn else (lambda shapes, precision: set())
        decoding_copy.DecodingAttention.fuse = fuse if fused else (lambda self, linears, packed=False: None)
        try:
            return load_translator(run, warn=False, beam=args.beam, precision=args.precision, compile="off")
        finally:
            choose.onednn_shapes, decoding_copy.DecodingAttention.fuse = measured, fuse

    systems = {"now": translator(True, True), "fused-only": translator(False, True), "before": translator(False, False)}
    names = list(systems)
    cpu = {k: [] for k in names}
    outputs = {}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.process_time()
            outputs[name] = systems[name].translate(lines)
            cpu[name].append(time.process_time() - start)
            print(f"round {r + 1}: {name} {cpu[name][-1]:.2f} CPU s", flush=True)
    same = {k: sum(a == b for a, b in zip(outputs[k], outputs["before"])) for k in names}
    result = {"machine": hardware.describe(), "sentences": len(lines), "precision": args.precision, "beam": args.beam,
              "best_cpu_s": {k: min(v) for k, v in cpu.items()}, "cpu_s": cpu, "same_as_before": same}
    print(f"{len(lines)} sentences, beam {args.beam}, {args.precision}, 1 thread, best of {args.rounds} (CPU s): "
          + ", ".join(f"{k} {min(v):.2f} (same as before {same[k]}/{len(lines)})" for k, v in cpu.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
