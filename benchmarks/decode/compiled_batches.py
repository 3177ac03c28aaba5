"""Where the compiled decoding step pays: one trained model's searches, eager against compiled
(the step built ahead of time, ``compiled/build.py``), in one process, at several batch sizes. The
two systems take turns, round after round, on the first N sentences of Multi30k's
test_2016_flickr (English), one thread; batch 1 decodes the first 32 sentences only.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/compiled_batches.py --run RUN_DIR \\
        [--precision fp32] [--beam 4] [--batches 1,8,32,128] [--n 128] [--rounds 3] [--packages DIR]

``--packages DIR`` keeps the built step there (a later run loads it instead of building).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ours  # noqa: E402  (part A's searches: the same settings)

from transformer import compiled, hardware
from transformer.data import Subwords, load_multi30k
from transformer.run.weights import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--packages", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {hardware.describe_line()}", flush=True)
    base, _ = load_model(args.run)
    sw = Subwords.load(f"{args.run}/subwords.model")
    ids = [sw.encode(src) for src, _ in load_multi30k("test_2016_flickr", "en", "de")[: args.n]]
    systems = {"eager": ours(copy.deepcopy(base), args.precision),
               "compiled": ours(copy.deepcopy(base), args.precision, compile="on")}
    compiled_model = systems["compiled"].model
    scratch = tempfile.TemporaryDirectory(prefix="compiled-batches-")  # removed at exit
    compiled.keep_in(compiled_model, args.packages or scratch.name)
    start = time.perf_counter()
    compiled.step(compiled_model, args.beam).prepare()
    print(f"{args.precision}, beam {args.beam}, {args.n} sentences, one thread, medians of {args.rounds} rounds; "
          f"the step built or loaded in {time.perf_counter() - start:.1f} s\n")
    print("| batch | decoder rows | eager, s | compiled, s | compiled x eager | outputs differing |")
    print("|---|---|---|---|---|---|")
    for size in (int(b) for b in args.batches.split(",")):
        batches = [ids[i:i + size] for i in range(0, len(ids), size)][: 32 if size == 1 else None]
        times: dict[str, list[float]] = {name: [] for name in systems}
        outputs = {}
        for _ in range(args.rounds):
            for name, decode in systems.items():
                t = time.perf_counter()
                outputs[name] = [out for srcs in batches for out in decode(srcs, args.beam, None)]
                times[name].append(time.perf_counter() - t)
        eager, compiled = statistics.median(times["eager"]), statistics.median(times["compiled"])
        differ = sum(a != b for a, b in zip(outputs["eager"], outputs["compiled"]))
        print(f"| {size} | {size * args.beam} | {eager:.2f} | {compiled:.2f} | {eager / compiled:.2f} | "
              f"{differ}/{len(outputs['eager'])} |", flush=True)


if __name__ == "__main__":
    main()
