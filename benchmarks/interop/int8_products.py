"""One linear layer's product at decoding batch sizes, in the ways this machine offers: fp32,
bf16, torch's weight-only int8 kernel (``aten._weight_int8pack_mm``, with fp32 or bf16
activations) and int8 dequantised to fp32 per call. Shapes of SmolLM2-135M (576 wide, FFN
1,536, vocabulary 49,152). Medians in microseconds, side by side in one process.

    .venv/bin/python benchmarks/interop/int8_products.py [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from transformer import hardware


def median_us(f, n: int = 50) -> float:
    for _ in range(5):
        f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}\n")
    print("| out x in | rows | fp32 | bf16 | int8pack, fp32 rows | int8pack, bf16 rows | int8 dequantised to fp32 |")
    print("|---|---|---|---|---|---|---|")
    for n, k in [(1536, 576), (576, 576), (49152, 576)]:
        for m in (1, 16):
            w, x = torch.randn(n, k), torch.randn(m, k)
            scale = w.abs().amax(1) / 127
            q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            wb, xb, sb = w.bfloat16(), x.bfloat16(), scale.bfloat16()
            cells = [median_us(lambda: F.linear(x, w)), median_us(lambda: F.linear(xb, wb)),
                     median_us(lambda: torch.ops.aten._weight_int8pack_mm(x, q, scale)),
                     median_us(lambda: torch.ops.aten._weight_int8pack_mm(xb, q, sb)),
                     median_us(lambda: F.linear(x, q * scale[:, None]))]
            print(f"| {n} x {k} | {m} | " + " | ".join(f"{c:,.1f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
