"""In-process A/B of the searches' compiled step: log-probabilities computed inside the
compiled graph (``compiled.step(model, group, logprobs=True)``, what greedy and beam search use)
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

from transformer import compiled, hardware
from transformer.compiled.search_step import CompiledStep
from transformer.data import Subwords, load_multi30k
from transformer.decode.scoring import next_token_logprobs
from transformer.run.weights import load_model


class LogitsThenEagerLogprobs(CompiledStep):
    """The earlier searches' step: compiled logits, log-probabilities computed eagerly."""

    def __call__(self, tokens, cache):
        logits, cache = super().__call__(tokens, cache)
        return next_token_logprobs(logits, self.model.cfg), cache


def logits_then_eager_logprobs(model, group: int):
    return LogitsThenEagerLogprobs(model, compiled.step(model, group, logprobs=False).runner, logprobs=False)


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

    steps = {"logits, eager log-probs": logits_then_eager_logprobs, "log-probs in the graph": compiled.step}
    systems = {name: ours(copy.deepcopy(base), args.precision, compile="on", compiled_step=step)
               for name, step in steps.items()}

    def run(name):
        return search(systems[name])

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
