"""What one decoding step does, per precision: operators, host reads, dtype copies and time.

A search's step on a GPU costs its kernels plus every read back to the host (each waits for the
queue of kernels to drain). This counts, per step of greedy and beam search (the eager step,
the searches' default), the operators torch runs, the reads of device values on the host
(``.item()``, ``bool()``, ``.tolist()`` ...; tests/host_reads.py), the data-dependent shapes
(``nonzero``, which also wait) and the dtype copies (``_to_copy``), in fp32 and bf16, on random
weights of the ``make run`` model's shape (or a run's with ``--run``), every sentence forced to
``--steps`` tokens so that both precisions do the same number of steps.

    .venv/bin/python benchmarks/decode/step_profile.py [--device cuda] [--batch 32] [--steps 20] [--sdpa default,cudnn,flash,efficient,math]

On a GPU it also lists the kernels that took the most device time, and ``--sdpa`` repeats the
measurement with torch's attention limited to each named backend (``default``: torch's own
choice), to see which one a step runs and what each costs.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from transformer import ModelConfig, Transformer, hardware
from transformer.decode import beam_search, greedy_search
from transformer.decode.precision import for_inference

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from host_reads import HostReads  # noqa: E402 (the tests' counter of host reads)

WATCH = ("aten::_local_scalar_dense", "aten::nonzero", "aten::_to_copy", "aten::copy_", "aten::index",
         "aten::scaled_dot_product_attention")


def search(name: str, model, src: torch.Tensor, steps: int):
    kw = dict(max_len_a=0.0, max_len_b=steps, min_length=steps)  # the eager step (no step= given)
    if name == "greedy":
        return greedy_search(model, src, **kw)
    return beam_search(model, src, int(name.removeprefix("beam")), 0.6, **kw)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model, src, name: str, steps: int, device: torch.device) -> dict:
    search(name, model, src, steps)  # warm-up
    sync(device)
    with HostReads() as reads:
        t = time.perf_counter()
        search(name, model, src, steps)
        sync(device)
        wall = time.perf_counter() - t
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        search(name, model, src, steps)
        sync(device)
    events = prof.key_averages()
    counts = Counter({e.key: e.count for e in events})
    aten = sum(n for k, n in counts.items() if k.startswith("aten::"))
    device_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
    out = {"ms_per_step": wall * 1e3 / steps, "aten_ops_per_step": aten / steps, "host_reads_per_step": reads.count / steps,
           "device_ms_per_step": device_us / 1e3 / steps}
    out.update({k.removeprefix("aten::"): counts.get(k, 0) / steps for k in WATCH})
    out["top_reads"] = reads.where()[:300]
    out["top_ops"] = ", ".join(f"{k.removeprefix('aten::')} {n / steps:.0f}" for k, n in counts.most_common(12)
                               if k.startswith("aten::"))
    kernels = sorted((e for e in events if getattr(e, "device_type", None) is not None
                      and str(e.device_type).endswith("CUDA") and e.self_device_time_total > 0),
                     key=lambda e: -e.self_device_time_total)
    out["top_kernels"] = "; ".join(f"{e.key[:60]} {e.self_device_time_total / 1e3 / steps:.3f} ms" for e in kernels[:8])
    return out


def backend(name: str):
    """A context that limits torch's attention to one backend (``default``: no limit)."""
    import contextlib

    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--run", help="a run directory whose model to decode with (default: random weights)")
    ap.add_argument("--batch", type=int, default=32, help="sentences decoded together")
    ap.add_argument("--length", type=int, default=14, help="source tokens per sentence")
    ap.add_argument("--steps", type=int, default=20, help="tokens every sentence is forced to")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--searches", default="greedy,beam4")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--sdpa", default="default", help="comma-separated attention backends to try, each alone: "
                                                      "default, cudnn, flash, efficient, math")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"machine: {hardware.describe_line()}" + (f"; {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    if args.run:
        from transformer.run import load_model

        model = load_model(args.run)
    else:
        torch.manual_seed(0)
        model = Transformer(ModelConfig.preset("tiny", vocab_size=8000, dropout=0.1))
    model = model.to(device).eval()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, model.cfg.vocab_size, (args.batch, args.length), generator=g)
    src[:, -1] = model.cfg.eos_id
    src[::3, args.length // 2:] = model.cfg.pad_id  # a third of the sentences shorter: padding, as in real batches
    src = src.to(device)
    rows = []
    for sdpa in args.sdpa.split(","):
        for name in args.searches.split(","):
            for precision in args.precisions.split(","):
                m = for_inference(model, precision)
                try:
                    with backend(sdpa):
                        rows.append((f"{name} ({sdpa})", precision, measure(m, src, name, args.steps, device)))
                except RuntimeError as e:  # no kernel of that backend for these inputs
                    print(f"{name} {precision} with {sdpa} attention: {str(e).splitlines()[0]}")
    cols = ["ms_per_step", "device_ms_per_step", "aten_ops_per_step", "host_reads_per_step",
            *(k.removeprefix("aten::") for k in WATCH)]
    print(f"\nper decoding step, batch {args.batch}, {args.steps} steps, compile off\n")
    print("| search | precision | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols))
    for name, precision, r in rows:
        print(f"| {name} | {precision} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + " |")
    for name, precision, r in rows:
        print(f"\n{name} {precision}: reads by site: {r['top_reads']}\n  most frequent operators: {r['top_ops']}")
        if r["top_kernels"]:
            print(f"  kernels by device time per step: {r['top_kernels']}")


if __name__ == "__main__":
    main()
