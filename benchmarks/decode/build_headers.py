"""What the compiled step's build costs with the C++ headers torch's compiler precompiles
(``.h.gch``) in the private build folder (``run/private.py``) against where torch puts them
(``torchinductor_USER`` in the shared temporary folder) and against none at all. Each build is
a fresh process that builds the greedy step of a model of the ``make run`` shape (random
weights, fp32, inductor's GEMM timing off, as the tests build) into a fresh build folder, so no
generated code is reused; only the headers differ:

    shared   torch's own place for them, already there (the code before the headers moved)
    warm     the private build folder's, already there (every build after a cache's first)
    cold     the private build folder's, made by this build (a cache's first build)
    off      no precompiled headers (torch's switches for them off)

The modes take turns, ``--rounds`` times; medians.

    .venv/bin/python benchmarks/decode/build_headers.py [--rounds 3] [--modes shared,warm,cold,off]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformer import hardware

BUILD = """
import sys, torch
from torch._inductor import codecache
from transformer import ModelConfig, Transformer
from transformer.compiled import build as aot
from transformer.run import private
mode, headers = sys.argv[1], sys.argv[2]
if mode == "shared":  # where torch itself puts them (what use_private_build_folder now overrides)
    private._private_headers = lambda folder: None
    codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR = headers, headers + "/locks"
options = {**aot.INDUCTOR_OPTIONS, "max_autotune_gemm": False}
if mode == "off":
    options["aot_inductor.precompile_headers"] = False
aot.INDUCTOR_OPTIONS = options
torch.manual_seed(0)
model = Transformer(ModelConfig.preset("tiny", vocab_size=8000, dropout=0.1)).eval()
aot.build(model, 1, True, sys.argv[3])
"""


def build_once(mode: str, work: Path, warm: Path) -> float:
    """Seconds of one build in a fresh process, its build folder fresh (the warm headers copied in)."""
    cache = Path(tempfile.mkdtemp(dir=work))
    folder = cache / "inductor"
    if mode == "warm":
        shutil.copytree(warm, folder / "precompiled_headers")
    env = {**os.environ, "TRANSFORMER_COMPILED_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(folder)}
    if mode == "off":
        env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BUILD, mode, str(work / "shared"), str(cache / "step.pt2")],
                   check=True, env=env, capture_output=True)
    seconds = time.perf_counter() - start
    if mode == "cold" and not warm.exists():
        shutil.copytree(folder / "precompiled_headers", warm)
    shutil.rmtree(cache)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="shared,warm,cold,off")
    args = ap.parse_args()
    modes = args.modes.split(",")
    print(f"machine: {hardware.describe_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work, warm = Path(tmp), Path(tmp) / "warm-headers"
        print("warming up: the shared and the warm headers", flush=True)
        build_once("shared", work, warm)
        build_once("cold", work, warm)
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                times[mode].append(build_once(mode, work, warm))
                print(f"round {r + 1} {mode}: {times[mode][-1]:.1f} s", flush=True)
    base = statistics.median(times[modes[0]])
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"{mode:7s} median {med:6.1f} s  ({med / base:.2f}x {modes[0]})  rounds: "
              + " ".join(f"{t:.1f}" for t in times[mode]))


if __name__ == "__main__":
    main()
