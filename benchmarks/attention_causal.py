"""Causal self-attention, forward + backward, three ways, at the recipes' shapes on this machine:

    readable   model.attention's matmul-softmax-matmul with the causal mask as a tensor
    sdpa-mask  torch's fused kernel given the causal mask as a tensor (the code before is_causal)
    sdpa-causal  torch's fused kernel with is_causal=True and no mask tensor (the code now, where
               the fused kernel is used)

The variants take turns round by round; the table gives the median time of each and its ratio
to ``readable``, per dtype. ``model/attention.py`` uses the fused kernel on a CPU in fp32 only
(in bf16 the readable one measured faster): this checks that choice for the causal case.

    .venv/bin/python benchmarks/attention_causal.py [--rounds 7] [--reps 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from transformer import hardware
from transformer.model import masks
from transformer.model.attention import attention

SHAPES = {  # name: (B, H, T, D)
    "nanoGPT CPU recipe (shakespeare-char)": (12, 4, 64, 32),
    "10-minute recipe (shakespeare-char-llama)": (16, 8, 128, 32),
    "make run decoder (4,096 tokens, length 30)": (136, 4, 30, 32),
}


def variants(t: int):
    mask = masks.causal_mask(t, t)
    return {
        "readable": lambda q, k, v: attention(q, k, v, mask, need_weights=True)[0],
        "sdpa-mask": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "sdpa-causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5, help="forward + backward passes per variant and round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="fp32,bf16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}")
    print("| shape (B, H, T, D) | dtype | readable ms | sdpa-mask ms | sdpa-causal ms | sdpa-causal vs readable | "
          "sdpa-causal vs sdpa-mask |\n|---|---|---|---|---|---|---|")
    for name, (b, h, t, d) in SHAPES.items():
        for dt in args.dtypes.split(","):
            dtype = torch.bfloat16 if dt == "bf16" else torch.float32
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(b, h, t, d, generator=g).to(dtype).requires_grad_() for _ in range(3))
            grad = torch.randn(b, h, t, d, generator=g).to(dtype)
            fns = variants(t)
            times = {n: [] for n in fns}
            for r in range(args.rounds + 1):
                for n, fn in fns.items():
                    start = time.perf_counter()
                    for _ in range(args.reps):
                        fn(q, k, v).backward(grad)
                    if r:  # round 0 warms up
                        times[n].append((time.perf_counter() - start) / args.reps)
            med = {n: statistics.median(ts) * 1e3 for n, ts in times.items()}
            print(f"| {name} ({b}, {h}, {t}, {d}) | {dt} | {med['readable']:.2f} | {med['sdpa-mask']:.2f} | "
                  f"{med['sdpa-causal']:.2f} | {med['readable'] / med['sdpa-causal']:.2f}x | "
                  f"{med['sdpa-mask'] / med['sdpa-causal']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
