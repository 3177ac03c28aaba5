"""One linear layer at decoding shapes, in every way decoding can multiply it: float32, bfloat16
weights, and int8 weights by each of :class:`~transformer.decode.int8.Int8Linear`'s
kernels (weight-only in bf16 and in fp32; ``torch._int_mm`` on the input quantised per row;
fbgemm's dynamically quantised linear). Each case is what a decoding call costs, the input's
quantisation and the output's rescaling included; bf16 takes a bf16 input (a bf16 model's
activations are bf16 already), the others a float32 one.

The kernels take turns within every round (the order rotates), over ``--rounds`` rounds; a
case's figure is its fastest round (other load on a shared machine only ever slows a round
down); a round's sample of a case is as many calls in a row as take about 5 ms. Printed as ms per call and as each kernel's time over bf16's, per shape and rows.

    .venv/bin/python benchmarks/decode/linear_kernels.py [--rows 4,16,64,256] [--rounds 7] \\
        [--shapes 512x2048,2048x512,512x1536,512x58101,128x256,256x128,128x384,128x8000] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F

from transformer import hardware
from transformer.decode.int8 import INT8_KERNELS, Int8Linear, fbgemm_available

SHAPES = "512x2048,2048x512,512x1536,512x58101,128x256,256x128,128x384,128x8000"


def cases(d_in: int, d_out: int, rows: int) -> dict[str, tuple]:
    """name -> (call, its argument) for one (in, out) layer and ``rows`` input rows."""
    torch.manual_seed(0)
    linear = nn.Linear(d_in, d_out, bias=d_out != 58101 and d_out != 8000)  # output projections: no bias
    x = torch.randn(rows, d_in)
    w, b = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    wb, bb = w.bfloat16(), None if b is None else b.bfloat16()
    out = {"fp32": (lambda v: F.linear(v, w, b), x), "bf16": (lambda v: F.linear(v, wb, bb), x.bfloat16())}
    for kernel in INT8_KERNELS:
        if kernel == "fbgemm" and not fbgemm_available():
            continue
        layer = Int8Linear.from_linear(linear, kernel)
        out[f"int8 {kernel}"] = (layer, x)
    return out


def time_once(call, arg, repeat: int) -> float:
    """Seconds per call over ``repeat`` calls in a row."""
    start = time.perf_counter()
    for _ in range(repeat):
        call(arg)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="4,16,64,256")
    ap.add_argument("--shapes", default=SHAPES, help="IN x OUT, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(hardware.describe_line())
    rows = [int(r) for r in args.rows.split(",")]
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    names = None
    with torch.inference_mode():
        for d_in, d_out in shapes:
            for n in rows:
                todo = cases(d_in, d_out, n)
                names = names or list(todo)
                repeat = {}
                for k, (call, arg) in todo.items():  # warm-up (fbgemm packs, oneDNN picks its kernels),
                    call(arg)  # and enough calls in a row for a sample of about 5 ms
                    repeat[k] = max(1, min(200, int(0.005 / max(time_once(call, arg, 1), 1e-6))))
                best = {k: float("inf") for k in todo}
                order = list(todo)
                for r in range(args.rounds):
                    for k in order[r % len(order):] + order[:r % len(order)]:
                        best[k] = min(best[k], time_once(*todo[k], repeat[k]))
                fastest = min(best, key=best.get)
                cells = " ".join(f"{k}={best[k] * 1e3:.3f}ms({best[k] / best['bf16']:.2f})" for k in todo)
                print(f"{d_in}x{d_out} rows {n}: {cells}  fastest: {fastest}", flush=True)


if __name__ == "__main__":
    main()
