"""The vocabulary shortlist's speed: ``transformer translate``'s work (``Translator``, eager) with
and without ``--shortlist``, in each precision, on the first ``--n`` test_2016_flickr sentences,
beam 4, rounds alternating, in CPU time (the machine is shared: wall time measures the others).

A run trained here has its shortlist built from its own corpus on first use; an imported one
(``real_size.py``'s ``--work``/run, whose random weights never end a sentence: every system
decodes its 63 steps a hypothesis) gets one built from Multi30k's training pairs
(:func:`~transformer.inference.run_shortlist.build_run_shortlist`), written into the run.
Prints the CPU, the load, each turn and the shortlist's rows for the sentences.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/shortlist.py --run RUN \\
        [--n 32] [--rounds 2] [--precisions fp32,bf16] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a translation run (one trained here, or imported)")
    ap.add_argument("--n", type=int, default=32, help="test_2016_flickr sentences")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    from transformer import hardware
    from transformer.data import load_multi30k
    from transformer.decode import pad_batch
    from transformer.inference.run_shortlist import build_run_shortlist
    from transformer.inference.translator import load_translator
    from transformer.run.layout import IMPORT_RECORD, SHORTLIST, read_run_config

    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}; {args.threads} thread(s)", flush=True)
    config = read_run_config(args.run)
    src_lang, tgt_lang = config.get("src_lang", "en"), config.get("tgt_lang", "de")
    test = [s for s, _ in load_multi30k("test_2016_flickr", src_lang, tgt_lang, download=False)][: args.n]
    if (Path(args.run) / IMPORT_RECORD).is_file() and not (Path(args.run) / SHORTLIST).exists():
        plain = load_translator(args.run, warn=False, precision="fp32", compile="off")
        start = time.process_time()
        pairs = load_multi30k("train", src_lang, tgt_lang, download=False)
        build_run_shortlist(args.run, pairs, plain.subwords, plain.model.cfg)
        print(f"built the shortlist from {len(pairs):,} Multi30k training pairs: {time.process_time() - start:.1f} s CPU")
    translators = {(p, s): load_translator(args.run, warn=False, beam=args.beam, precision=p, compile="off",
                                           shortlist=s)
                   for p in args.precisions.split(",") for s in (False, True)}
    times: dict = {k: [] for k in translators}
    tokens: dict = {}
    for r in range(args.rounds):
        for key in (list(translators) if r % 2 == 0 else list(reversed(translators))):
            start, wall = time.process_time(), time.perf_counter()
            out = translators[key].translate_nbest(test, 1)
            times[key].append(time.process_time() - start)
            tokens[key] = sum(len(x[0].tokens) for x in out)
            print(f"round {r + 1} {key[0]} shortlist={key[1]}: {times[key][-1]:.1f} s CPU, "
                  f"{time.perf_counter() - wall:.1f} s wall, load {os.getloadavg()[0]:.1f}", flush=True)
    for p in args.precisions.split(","):
        full, short = min(times[p, False]), min(times[p, True])
        print(f"{p}: whole vocabulary {full:.1f} s, shortlist {short:.1f} s CPU (fastest of {args.rounds}): "
              f"{full / short:.2f}x; tokens {tokens[p, False]} and {tokens[p, True]}")
    listed = translators[args.precisions.split(",")[0], True]
    src = pad_batch([listed.encode(line) for line in test], listed.model.cfg.pad_id)
    print(f"shortlist rows for these {len(test)} sentences: {listed.shortlist.for_batch(src).numel():,} of "
          f"{listed.model.cfg.target_vocab_size:,}")


if __name__ == "__main__":
    main()
