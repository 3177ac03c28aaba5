"""The compiled step across processes: what one `transformer translate` command costs when it
builds the run's compiled step (the first `--compile on`), when it loads the step that the run
keeps (every later command, by default: `--compile auto`), and eagerly (`--compile off`). Each
figure is the wall time of a fresh process of the real command (start-up, loading, translating
the first N sentences of Multi30k's test_2016_flickr, writing the output), on a copy of the run.
``--max-tokens 1`` makes every batch one sentence (as a server's or an interactive user's
requests come): the compiled step serves batches of up to 64 decoder rows (sentences x beam),
larger ones decode eagerly.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/decode/first_command.py --run RUN_DIR \\
        [--n 1000] [--beam 4] [--precision fp32] [--max-tokens 4000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformer import hardware
from transformer.data import load_multi30k
from transformer.run import AVERAGED, BEST, CKPT_DIR, COMPILED

TRANSFORMER = str(Path(sys.executable).with_name("transformer"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    ap.add_argument("--max-tokens", type=int, default=4000, help="source tokens per batch (translate's option)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {hardware.describe_line()}", flush=True)
    run = Path(args.run)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"
        skip = [COMPILED] + ([CKPT_DIR] if (run / AVERAGED).is_file() or (run / BEST).is_file() else [])
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns(*skip))
        source = Path(tmp) / "source.en"
        source.write_text("".join(src + "\n" for src, _ in load_multi30k("test_2016_flickr", "en", "de")[: args.n]),
                          encoding="utf-8")

        def translate(compile: str) -> tuple[float, list[str]]:
            out = Path(tmp) / f"out-{compile}.de"
            cmd = [TRANSFORMER, "translate", "--model", str(copy), "--input", str(source), "--output", str(out),
                   "--beam", str(args.beam), "--precision", args.precision, "--max-tokens", str(args.max_tokens),
                   "--compile", compile]
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            return time.perf_counter() - start, out.read_text(encoding="utf-8").splitlines()

        first_eager, eager_lines = translate("off")
        build, built_lines = translate("on")
        times: dict[str, list[float]] = {"off": [], "auto": []}
        outputs = {}
        for _ in range(args.rounds):
            for compile in times:
                seconds, outputs[compile] = translate(compile)
                times[compile].append(seconds)
        packages = sorted(p.name for p in (copy / COMPILED).iterdir())

    eager = statistics.median(times["off"])
    print(f"{args.n} sentences, beam {args.beam}, {args.precision}, --max-tokens {args.max_tokens}; "
          f"medians of {args.rounds} rounds; "
          f"packages: {', '.join(packages)}\n")
    print("| command | seconds | x eager | lines differing from eager |")
    print("|---|---|---|---|")
    rows = [("`--compile off` (eager)", eager, eager_lines),
            ("`--compile on`, first: builds the step", build, built_lines),
            ("default (`auto`): loads the step", statistics.median(times["auto"]), outputs["auto"])]
    for name, seconds, lines in rows:
        differ = sum(a != b for a, b in zip(lines, eager_lines))
        print(f"| {name} | {seconds:.1f} | {eager / seconds:.2f} | {differ}/{len(eager_lines)} |")
    print(f"\n(first eager command, before the others: {first_eager:.1f} s)")


if __name__ == "__main__":
    main()
