"""In-process A/B of the searches' compiled step: log-probabilities computed inside the
compiled graph (``compiled_step(model, logprobs=True)``, what greedy and beam search use)
against the logits step followed by an eager ``next_token_logprobs`` (the earlier code).
Two copies of one trained model take turns, round after round, on the first 64 sentences
of Multi30k's test_2016_flickr (English), one thread.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/decode/logprob_step.py --run RUN_DIR \\
        [--precision bf16] [--beam 1] [--batch 32] [--rounds 9]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ours  # noqa: E402  (part A's searches: the same settings)

from transformer import hardware
from transformer.data import Subwords, load_multi30k
from transformer.decode import static
from transformer.decode.common import next_token_logprobs
from transformer.run.weights import load_model


COMPILED_STEP = static.compiled_step  # the searches build their step through static.compiled_step


def logits_then_eager_logprobs(model, logprobs: bool = False):
    """The earlier searches' step: compiled logits, log-probabilities computed eagerly."""
    step = COMPILED_STEP(model)
    return (lambda *args: next_token_logprobs(step(*args), model.cfg)) if logprobs else step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {hardware.describe_line()}", flush=True)
    base, _ = load_model(args.run)
    sw = Subwords.load(f"{args.run}/subwords.model")
    sources = [src for src, _ in load_multi30k("test_2016_flickr", "en", "de")][:64]
    ids = [sw.encode(s) for s in sources]
    batches = [ids[i:i + args.batch] for i in range(0, len(ids), args.batch)]

    def search(decode):
        return [out for srcs in batches for out in decode(srcs, args.beam, None)]

    steps = {"logits, eager log-probs": logits_then_eager_logprobs, "log-probs in the graph": COMPILED_STEP}
    systems = {name: ours(copy.deepcopy(base), args.precision, compile="on") for name in steps}

    def run(name):
        static.compiled_step = steps[name]
        try:
            return search(systems[name])
        finally:
            static.compiled_step = COMPILED_STEP

    eager = search(ours(base, args.precision))
    outputs, first = {}, {}
    for name in steps:
        t = time.perf_counter()
        outputs[name] = run(name)
        first[name] = time.perf_counter() - t
    times = {name: [] for name in steps}
    for r in range(args.rounds):
        for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            t = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - t)
    tokens = sum(len(t) for t in eager)  # without EOS
    old = statistics.median(times["logits, eager log-probs"])
    print(f"{args.precision}, beam {args.beam}, batch {args.batch}, {args.rounds} rounds")
    print("| step | s (median) | tokens/s | x logits step | outputs differing from eager | first call, s |")
    print("|---|---|---|---|---|---|")
    for name, v in times.items():
        s = statistics.median(v)
        differ = sum(a != b for a, b in zip(outputs[name], eager))
        print(f"| {name} | {s:.4f} | {tokens / s:,.0f} | {old / s:.3f} | {differ}/{len(eager)} | {first[name]:.1f} |")


if __name__ == "__main__":
    main()
