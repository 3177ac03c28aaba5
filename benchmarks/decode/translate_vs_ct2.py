"""`transformer translate`'s work against CTranslate2 on the project's own export, side by side.

The issue's figure: the 1,000 Multi30k test_2016_flickr sentences, beam 4, in the run's batches
(``max_tokens``), each system on the same subword ids. Ours runs as ``translate`` does
(:class:`transformer.Translator`: sorted by length, batched, the run's search at the precision
asked for, ``auto`` by default); CTranslate2 runs ``translate_batch`` on the same ids in the same
batches, at the compute type asked for (``float32`` matches our fp32). Rounds alternate which
system goes first; each figure is the median over rounds, and the ratio is taken per round.
Outputs are compared as text. Both rank by raw log-probability (``--alpha 0``, the default here):
our length penalty is GNMT's ``((5 + len) / 6) ** alpha``, CTranslate2's ``len ** alpha``, so they
agree only at 0. Prints the machine first (``transformer.hardware``).

With ``--whole``, each figure is instead a whole command in a fresh process, as a user runs it:
``transformer translate --model RUN --input SRC --output OUT`` (start-up, loading, the run's
compiled step where it keeps one, tokenising, translating, writing), against a Python process
that does the same with CTranslate2 on the export (import, load, sentencepiece, ``translate_batch``
with its own batching by tokens, write): wall time and the child's CPU time.

    TRANSFORMER_DATA=DATA_DIR python benchmarks/decode/translate_vs_ct2.py --run runs/demo [--precision fp32] [--rounds 3] [--whole]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer import hardware


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a translation run directory")
    ap.add_argument("--src", help="source sentences, one a line (default: Multi30k test_2016_flickr of the run's "
                                  "source language under $TRANSFORMER_DATA)")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.0, help="length penalty for both (they agree only at 0)")
    ap.add_argument("--precision", default="fp32", help="ours: auto, fp32, bf16 or int8")
    ap.add_argument("--compute-type", default="float32", help="CTranslate2's compute_type")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads for both (0: torch's default)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--whole", action="store_true", help="time whole commands in fresh processes")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)

    import ctranslate2

    from transformer.interop.ctranslate2 import save_ctranslate2
    from transformer.inference.translator import load_translator

    ours = load_translator(args.run, warn=False, beam=args.beam, alpha=args.alpha, precision=args.precision,
                           compile="off")
    if args.src:
        lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    else:  # the run's source language
        from transformer.data.corpus import read_lines
        from transformer.data.registry import multi30k_path
        from transformer.run.layout import read_run_config

        lines = read_lines(multi30k_path("test_2016_flickr", read_run_config(args.run)["src_lang"], download=False))
    lines = lines[: args.n]

    sw = ours.subwords
    vocab = [sw.id_to_piece(i) for i in range(sw.vocab_size)]
    index = {p: i for i, p in enumerate(vocab)}
    ct2_dir = Path(tempfile.mkdtemp(prefix="ct2.")) / "model"
    save_ctranslate2(ours.model if args.precision == "fp32" else load_translator(args.run, precision="fp32").model,
                     ct2_dir, vocab)
    ct2 = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=args.compute_type,
                                 intra_threads=torch.get_num_threads())
    # the same batches as ours: sorted by length, at most max_tokens padded source tokens (ids end
    # with EOS; CTranslate2 appends its own: add_source_eos)
    encoded = [ours.encode(line) for line in lines]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(encoded[order[end]]) <= ours.decoding.max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    d = ours.decoding

    def run_ours():
        return ours.translate(lines)

    def run_ct2():
        out = [""] * len(lines)
        for batch in batches:
            res = ct2.translate_batch([[vocab[t] for t in encoded[i][:-1]] for i in batch], beam_size=args.beam,
                                      length_penalty=args.alpha, max_batch_size=0,
                                      max_decoding_length=int(d.max_len_a * max(len(encoded[i]) for i in batch)
                                                              + d.max_len_b))
            for i, r in zip(batch, res):
                out[i] = sw.decode([index[p] for p in r.hypotheses[0]])
        return out

    if args.whole:
        longest = int(d.max_len_a * max(len(e) for e in encoded) + d.max_len_b)  # (CTranslate2 takes one limit)
        run_ours, run_ct2 = whole_commands(args, lines, ct2_dir, ours.subwords.path, d.max_tokens,
                                           min(longest, ours.model.cfg.max_len - 1))
    times = {"ours": [], "ct2": []}
    cpu = {"ours": [], "ct2": []}  # the process's CPU seconds: what other load on a shared machine stretches less
    outputs = {}
    for r in range(args.rounds):
        for who in (("ours", "ct2") if r % 2 == 0 else ("ct2", "ours")):
            t0, c0 = time.perf_counter(), cpu_seconds(args.whole)
            outputs[who] = (run_ours if who == "ours" else run_ct2)()
            times[who].append(time.perf_counter() - t0)
            cpu[who].append(cpu_seconds(args.whole) - c0)
            print(f"round {r + 1}: {who} {times[who][-1]:.2f} s ({cpu[who][-1]:.2f} s of CPU)", file=sys.stderr,
                  flush=True)
    ratios = [c / o for o, c in zip(times["ours"], times["ct2"])]
    cpu_ratios = [c / o for o, c in zip(cpu["ours"], cpu["ct2"])]
    same = sum(a == b for a, b in zip(outputs["ours"], outputs["ct2"]))
    result = {"machine": hardware.describe(), "sentences": len(lines), "beam": args.beam, "precision": d.precision,
              "whole_commands": args.whole,
              "ct2_compute_type": args.compute_type, "ours_s": statistics.median(times["ours"]),
              "ct2_s": statistics.median(times["ct2"]), "ct2_over_ours_per_round": ratios,
              "ours_cpu_s": statistics.median(cpu["ours"]), "ct2_cpu_s": statistics.median(cpu["ct2"]),
              "ct2_over_ours_cpu_per_round": cpu_ratios,
              "identical_outputs": same}
    print(f"{len(lines)} sentences, beam {args.beam}: ours ({d.precision}) {result['ours_s']:.2f} s, "
          f"CTranslate2 ({args.compute_type}) {result['ct2_s']:.2f} s (medians of {args.rounds}); "
          f"ours takes {min(1 / x for x in ratios):.2f}-{max(1 / x for x in ratios):.2f}x CTranslate2's time "
          f"per round; in CPU time {result['ours_cpu_s']:.2f} s against {result['ct2_cpu_s']:.2f} s "
          f"({min(1 / x for x in cpu_ratios):.2f}-{max(1 / x for x in cpu_ratios):.2f}x); identical outputs "
          f"{same}/{len(lines)}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


CT2_COMMAND = """
import sys
import ctranslate2
import sentencepiece as spm

model, subwords, src, out, beam, alpha, max_tokens, length, threads, compute_type = sys.argv[1:]
sp = spm.SentencePieceProcessor(model_file=subwords)
translator = ctranslate2.Translator(model, device="cpu", compute_type=compute_type, intra_threads=int(threads))
lines = open(src, encoding="utf-8").read().splitlines()
results = translator.translate_batch(sp.encode(lines, out_type=str), beam_size=int(beam), length_penalty=float(alpha),
                                     max_batch_size=int(max_tokens), batch_type="tokens",
                                     max_decoding_length=int(length))
with open(out, "w", encoding="utf-8") as f:
    f.writelines(sp.decode_pieces(r.hypotheses[0]) + "\\n" for r in results)
"""


def cpu_seconds(children: bool) -> float:
    """CPU seconds used so far by this process, or (``children``) by its finished children."""
    if not children:
        return time.process_time()
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def whole_commands(args, lines, ct2_dir, subwords, max_tokens, length):
    """The two whole commands, each a function that runs it in a fresh process and returns its
    output lines: ``transformer translate`` on the run, and CTranslate2 on its export."""
    import subprocess

    tmp = Path(tempfile.mkdtemp(prefix="whole."))
    src = tmp / "source.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    script = tmp / "ct2_translate.py"
    script.write_text(CT2_COMMAND, encoding="utf-8")

    def run(cmd, out):
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        return out.read_text(encoding="utf-8").splitlines()

    transformer = str(Path(sys.executable).with_name("transformer"))
    ours = [transformer, "translate", "--model", args.run, "--input", str(src), "--output", str(tmp / "ours.txt"),
            "--beam", str(args.beam), "--alpha", str(args.alpha), "--precision", args.precision]
    ct2 = [sys.executable, str(script), str(ct2_dir), str(subwords), str(src), str(tmp / "ct2.txt"), str(args.beam),
           str(args.alpha), str(max_tokens), str(length), str(args.threads), args.compute_type]
    return (lambda: run(ours, tmp / "ours.txt")), (lambda: run(ct2, tmp / "ct2.txt"))


if __name__ == "__main__":
    main()
