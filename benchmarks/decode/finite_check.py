"""What refusing weights that are not finite costs a model's load (``run/weights.py``,
``refuse_non_finite``): ``load_model`` of the paper's base shape (random weights, 37,000
subwords, fp32) with the check and without it, taking turns, and the check's two ways over
the loaded tensors: a sum per tensor (what it does) and ``isfinite(t).all()``. Medians.

    .venv/bin/python benchmarks/decode/finite_check.py [--rounds 7] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from transformer import ModelConfig, Transformer, hardware
from transformer.run import save_weights
from transformer.run import weights as w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    check = w.refuse_non_finite
    times: dict[str, list[float]] = {"load, checked": [], "load, unchecked": [], "sum per tensor": [],
                                      "isfinite(t).all()": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "best.safetensors"
        save_weights(Transformer(ModelConfig.preset("base", vocab_size=37000)), path)
        _, tensors, _ = w.read_weights(path)
        print(f"{sum(t.numel() for t in tensors.values()):,} numbers", flush=True)
        for r in range(args.rounds):
            for checked in ((True, False) if r % 2 == 0 else (False, True)):
                w.refuse_non_finite = check if checked else (lambda tensors, path: None)
                start = time.perf_counter()
                w.load_model(path)
                times["load, checked" if checked else "load, unchecked"].append(time.perf_counter() - start)
            w.refuse_non_finite = check
            for name, way in (("sum per tensor", lambda t: torch.isfinite(t.sum())),
                              ("isfinite(t).all()", lambda t: torch.isfinite(t).all())):
                start = time.perf_counter()
                for t in tensors.values():
                    bool(way(t))
                times[name].append(time.perf_counter() - start)
    for name, ts in times.items():
        print(f"{name:18s} median {statistics.median(ts) * 1e3:7.0f} ms  rounds: "
              + " ".join(f"{t * 1e3:.0f}" for t in ts))


if __name__ == "__main__":
    main()
