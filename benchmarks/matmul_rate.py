"""The matmul rate that MFU is measured against (`train_throughput.py`, `gpu_base.py`)."""
from __future__ import annotations

import statistics
import time

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(dtype: torch.dtype, sizes: tuple[int, ...] = (2048, 3072, 4096),
                device: torch.device = torch.device("cpu"), reps: int = 5) -> float:
    """The best square-matmul rate (FLOP/s) over ``sizes``: the median of ``reps`` calls each,
    after three warm-up calls (on the CPU the first bf16 calls run at 60-80% of the later rate)."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        sync(device)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            a @ b
            sync(device)
            times.append(time.perf_counter() - t)
        best = max(best, 2 * n**3 / statistics.median(times))
    return best
