"""Where decoding time goes: torch.profiler's operator table (self CPU time) for one search
setting on the first N test sentences of a trained model, after one warm-up pass.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python -W ignore benchmarks/decode/where_time_goes.py \\
        --run runs/multi30k-en-de [--batch 32] [--beam 4] [--n 64] [--threads 1] [--rows 20] \\
        [--precision fp32] [--compile]

``--compile`` decodes through the step built ahead of time (built in a temporary folder, with
inductor's per-kernel profiling, so that each generated C++ kernel is a row of the table; the
matrix products it leaves to oneDNN or aten appear under their operator names).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import job, load_trained, ours, test_set  # noqa: E402

from transformer import hardware  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=4, help="1 = greedy")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=20, help="operators to list")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    ap.add_argument("--compile", action="store_true", help="through the step built ahead of time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True  # read when the package is built
    model, subwords, _ = load_trained(args.run)
    srcs = [subwords.encode(s) for s in test_set(args.n)[0]]
    decode = ours(model, args.precision, args.compile)  # run.py's searches and batches

    def run():
        job(decode, srcs, args.batch, args.beam, None)

    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
