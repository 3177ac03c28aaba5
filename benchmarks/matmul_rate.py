"""The matmul rate that MFU is measured against (`train_throughput.py`, `gpu_base.py`).

Run alone, it prints this machine's rate at each precision, e.g. bf16 against fp32 on a CPU
(4-5x faster with AMX / AVX512-BF16, about 20x slower where bf16 is emulated):

    .venv/bin/python benchmarks/matmul_rate.py [--dtypes fp32,bf16] [--sizes 1024,2048] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(dtype: torch.dtype, sizes: tuple[int, ...] = (2048, 3072, 4096),
                device: torch.device = torch.device("cpu"), reps: int = 5, clock=time.perf_counter) -> float:
    """The best square-matmul rate (FLOP/s) over ``sizes``: the median of ``reps`` calls each,
    after three warm-up calls (on the CPU the first bf16 calls run at 60-80% of the later rate).
    ``clock``: ``time.process_time`` gives FLOP per second of the process's CPU time, which a
    machine shared with other work does not stretch (CPU only)."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        sync(device)
        times = []
        for _ in range(reps):
            t = clock()
            a @ b
            sync(device)
            times.append(clock() - t)
        best = max(best, 2 * n**3 / statistics.median(times))
    return best


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="fp32,bf16", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--sizes", default="1024,2048", help="square matrix sizes, comma-separated (the best counts)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the rates here")
    args = ap.parse_args()
    from transformer import hardware

    print(f"machine: {hardware.describe_line()}", flush=True)
    device, sizes = torch.device(args.device), tuple(int(n) for n in args.sizes.split(","))
    rates = {name: matmul_rate(DTYPES[name], sizes, device) / 1e9 for name in args.dtypes.split(",")}
    print("| dtype | GFLOP/s |\n|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "sizes": sizes, "gflops": rates, "machine": hardware.describe()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
