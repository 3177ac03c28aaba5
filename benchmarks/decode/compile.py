"""torch.compile for decoding: what it buys, measured two ways on a trained model.

1. One decoding step at fixed shapes (``model.decode`` + log-softmax + top-k, a cache of
   10 positions): eager against ``torch.compile(dynamic=False)``. The best case: one graph,
   no guards to re-check, no recompilation.
2. The real searches of ``run.py`` (greedy and beam 4, batch 1 and 32, the first N test
   sentences) with ``model.decode`` compiled with ``dynamic=True``. The cache grows by one position a step
   and finished sentences leave the batch, so shapes change at every step.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/compile.py --run runs/multi30k-en-de
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import job, load_trained, ours, test_set  # noqa: E402

from transformer import hardware  # noqa: E402
from transformer.run.private import use_private_build_folder  # noqa: E402
from transformer.decode.rows import expand_rows  # noqa: E402

use_private_build_folder()  # torch.compile below builds in the user's private cache, not a shared folder


def one_step(model, rows: int, beam: int, src_len: int = 16, past: int = 10, reps: int = 200, rounds: int = 7):
    """Microseconds per step, eager and compiled (static shapes), medians of ``rounds``."""
    with torch.inference_mode():
        g = torch.Generator().manual_seed(0)
        src = torch.randint(4, model.cfg.vocab_size, (rows // beam, src_len), generator=g)
        cache = expand_rows(model.start_cache(model.encode(src), src), beam)
        last = torch.randint(4, model.cfg.vocab_size, (rows, 1), generator=g)
        for _ in range(past):
            _, cache = model.decode(last, cache)

        def step(last, cache):
            logits, _ = model.decode(last, cache)
            return torch.log_softmax(logits[:, -1].float(), -1).topk(2 * beam, dim=1)

        compiled = torch.compile(step, dynamic=False)
        for _ in range(3):
            compiled(last, cache)
        times = {"eager": [], "compiled": []}
        for _ in range(rounds):
            for name, fn in (("eager", step), ("compiled", compiled)):
                t = time.perf_counter()
                for _ in range(reps):
                    fn(last, cache)
                times[name].append((time.perf_counter() - t) / reps * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def searches(model, srcs, cases, rounds: int):
    """Seconds for each (batch, beam) case, eager and with model.decode compiled (dynamic),
    and how many outputs of the compiled run equal the eager ones. The searches are
    run.py's (``ours``: fp32, so ``model`` itself, whose ``decode`` is swapped)."""
    decode = ours(model)

    def run(bsz, beam):
        return job(decode, srcs, bsz, beam, None)[1]

    eager = model.decode
    compiled = torch.compile(model.decode, dynamic=True)
    t = time.perf_counter()
    model.decode = compiled
    for case in cases:
        run(*case)
    compile_s = time.perf_counter() - t
    res = {c: {"eager": [], "compiled": [], "same": 0} for c in cases}
    for _ in range(rounds):
        for case in cases:
            ref = None
            for name, fn in (("eager", eager), ("compiled", compiled)):
                model.decode = fn
                t = time.perf_counter()
                out = run(*case)
                res[case][name].append(time.perf_counter() - t)
                if ref is None:
                    ref = out
                else:
                    res[case]["same"] = sum(a == b for a, b in zip(out, ref))
    model.decode = eager
    return compile_s, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--n", type=int, default=64, help="test sentences for the searches")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    torch._dynamo.config.cache_size_limit = 64  # the searches need ~16 graphs (8 is the default limit)
    model, subwords, path = load_trained(args.run)
    print(f"model {path}; torch {torch.__version__}, {args.threads} thread(s)")

    print("\n1. one decoding step, fixed shapes (us per step, median)")
    print("| rows (batch x beam) | eager | compiled | eager / compiled |\n|---|---|---|---|")
    for rows in (4, 128):
        t = one_step(model, rows, 4)
        print(f"| {rows} | {t['eager']:.0f} | {t['compiled']:.0f} | {t['eager'] / t['compiled']:.2f}x |", flush=True)

    srcs = [subwords.encode(s) for s in test_set(args.n)[0]]
    cases = [(1, 1), (1, 4), (32, 4), (32, 1)]
    compile_s, res = searches(model, srcs, cases, args.rounds)
    print(f"\n2. the searches on {args.n} test sentences, model.decode compiled with dynamic=True "
          f"(compiling and the first pass of every case: {compile_s:.0f} s)")
    print("| search, batch | eager s | compiled s | eager / compiled | same outputs |\n|---|---|---|---|---|")
    for (bsz, beam), r in res.items():
        e, c = statistics.median(r["eager"]), statistics.median(r["compiled"])
        name = "greedy" if beam == 1 else f"beam {beam}"
        print(f"| {name}, batch {bsz} | {e:.2f} | {c:.2f} | {e / c:.2f}x | {r['same']}/{len(srcs)} |")


if __name__ == "__main__":
    main()
