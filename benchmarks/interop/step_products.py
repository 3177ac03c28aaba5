"""The matrix products of one decoding step of a SmolLM2-135M-shaped model (30 layers of
q, k, v, o, gate, up, down, and the 49,152-row head: 211 products, 538 MB of fp32 weights)
at batch 1 and 16, built the ways a compiled step can be, side by side in one process:

    fp32 eager              ``F.linear`` per weight (what any eager fp32 step pays at least)
    fp32 package            an AOTInductor package of the products, weights as they are
    fp32 package, frozen    the same built with the options of the project's compiled step
                            (:data:`transformer.compiled.build.INDUCTOR_OPTIONS`: freezing, so
                            prepacked weights, and inductor's GEMM template where it times faster)
    bf16 weights, fp32 sum  an AOTInductor package whose weights stay bfloat16 (not folded into
                            float32 constants at build time) and whose products are written as a
                            multiply and a float32 sum over each weight row: inductor fuses the
                            conversion into that loop, so a step reads half the bytes

No step can be faster than its products, so at batch 1 (where a product is a read of its
weights) this bounds what any fp32 step can reach on the machine's memory. Prints the machine,
medians of ``--rounds`` in ms and tokens/s.

    .venv/bin/python benchmarks/interop/step_products.py [--rounds 9] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from transformer import hardware
from transformer.compiled.build import INDUCTOR_OPTIONS

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)
HEAD = (49152, 576)


class Products(nn.Module):
    """Every weight of a step times its input rows; ``reduce``: as a multiply and a sum in
    float32 of weights stored as they are (bf16)."""

    def __init__(self, dtype: torch.dtype, reduce: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        shapes = LAYER * 30 + [HEAD]
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(o, i, generator=g).to(dtype), requires_grad=False)
                                         for o, i in shapes])
        self.reduce = reduce

    def forward(self, x576: torch.Tensor, x1536: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for w in self.weights:
            x = x576 if w.size(1) == 576 else x1536
            # (out, rows): the weight's rows outermost, so inductor splits them among the threads
            out.append((w.float()[:, None, :] * x).sum(-1).T if self.reduce else nn.functional.linear(x, w))
        return out


def package(module: nn.Module, folder: Path, name: str, options: dict, keep_dtypes: bool = False):
    """``module`` built into an AOTInductor package and loaded; ``keep_dtypes``: the weights'
    conversions are not folded into new constants at build time (so bf16 weights stay bf16)."""
    from torch._inductor import constant_folding

    rows = torch.export.Dim("rows", min=1, max=1024)
    example = (torch.randn(4, 576), torch.randn(4, 1536))
    convert = torch.ops.prims.convert_element_type.default
    if keep_dtypes:
        constant_folding.add_dont_constant_fold(convert)
    try:
        with torch.no_grad():
            program = torch.export.export(module, example, dynamic_shapes=({0: rows}, {0: rows}))
            path = torch._inductor.aoti_compile_and_package(program, package_path=str(folder / f"{name}.pt2"),
                                                            inductor_configs=dict(options))
    finally:
        while convert in constant_folding._dont_constant_fold:
            constant_folding._dont_constant_fold.remove(convert)
    return torch._inductor.aoti_load_package(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {hardware.describe_line()}", flush=True)
    fp32, bf16 = Products(torch.float32, False).eval(), Products(torch.bfloat16, True).eval()
    folder = Path(tempfile.mkdtemp(prefix="step-products."))
    systems = {"fp32 eager": fp32}
    for name, module, options in [("fp32 package", fp32, {}), ("fp32 package, frozen", fp32, INDUCTOR_OPTIONS),
                                  ("bf16 weights, fp32 sum", bf16, {})]:
        t = time.perf_counter()
        systems[name] = package(module, folder, name.replace(" ", "_").replace(",", ""), options,
                                keep_dtypes=module is bf16)
        print(f"built {name}: {time.perf_counter() - t:.0f} s", flush=True)
    megabytes = sum(w.numel() for w in fp32.weights) * 4 / 1e6
    print(f"\n{len(fp32.weights)} products, {megabytes:.0f} MB of fp32 weights; torch {torch.__version__}, "
          f"{args.threads} threads, medians of {args.rounds}\n")
    print("| rows | system | ms a step | tokens/s | x fp32 eager |")
    print("|---|---|---|---|---|")
    for rows in (1, 16):
        x = (torch.randn(rows, 576), torch.randn(rows, 1536))
        with torch.no_grad():
            reference = fp32(*x)
            times: dict[str, list[float]] = {n: [] for n in systems}
            for n, f in systems.items():  # warm-up, and each system's products checked
                out = f(*x)
                err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(out, reference))
                assert err < (1e-2 if "bf16" in n else 1e-4), (n, err)  # bf16: the weights rounded
            for r in range(args.rounds):
                names = list(systems)
                for n in names[r % len(names):] + names[:r % len(names)]:
                    t = time.perf_counter()
                    systems[n](*x)
                    times[n].append(time.perf_counter() - t)
        ms = {n: statistics.median(v) * 1e3 for n, v in times.items()}
        for n in systems:
            print(f"| {rows} | {n} | {ms[n]:.1f} | {rows * 1e3 / ms[n]:,.0f} | {ms['fp32 eager'] / ms[n]:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
