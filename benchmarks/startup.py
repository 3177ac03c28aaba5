"""Start-up: what one `transformer translate` of one sentence costs against a bare
`python -c 'import torch'`, and where the difference goes. Each figure is the wall time of a
fresh process, the rows taken in turn in every round (so a busy machine slows them alike);
the table gives each row's median and its ratio to `import torch`'s, in wall time and in
CPU time (user + system, all threads: less moved by other work on a shared machine).

Rows: the interpreter alone (`python -c pass`); `import torch`; `import torch` and every
module of this package that `translate` loads (the parser, the translator, the searches),
without reading a model; the whole command (one sentence on stdin, the run's decoding
settings, `--compile auto`: eager unless the run's compiled step was built). `--old-src`
adds the whole command on another source tree (e.g. before a change, unpacked with
`git archive COMMIT src | tar -x -C OLD`).

    .venv/bin/python benchmarks/startup.py --run runs/demo [--rounds 9] [--old-src OLD/src] [--threads N] \\
        [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from transformer import hardware

SRC = Path(__file__).resolve().parents[1] / "src"
SENTENCE = "Two dogs are playing in the snow.\n"
# what translate imports before it reads a model (its parser and the code it decodes with)
MODULES = ("import torch, transformer.cli, transformer.cli.translate, transformer.inference.translator, "
           "transformer.decode.greedy, transformer.decode.beam")


def rows(run: str, old_src: str | None) -> list[tuple[str, list[str], str]]:
    """(name, argv, PYTHONPATH) of each row."""
    py = sys.executable
    translate = [py, "-m", "transformer", "translate", "--model", run]
    found = [("`python -c pass` (the interpreter)", [py, "-c", "pass"], str(SRC)),
             ("`python -c 'import torch'`", [py, "-c", "import torch"], str(SRC)),
             ("`import torch` + the modules translate loads", [py, "-c", MODULES], str(SRC)),
             ("`transformer translate --model RUN` (one sentence)", translate, str(SRC))]
    if old_src:
        found.append((f"the same, source tree {old_src}", translate, old_src))
    return found


def timed(argv: list[str], pythonpath: str, threads: int | None = None) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system, the child's threads together) and stdout."""
    env = {**os.environ, "PYTHONPATH": pythonpath, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, input=SENTENCE, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/demo", help="a translation run directory (default: runs/demo)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--old-src", help="also time the command on this source tree (its src folder)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every row (default: torch's own choice)")
    ap.add_argument("--out", help="write the medians and every time here (JSON)")
    args = ap.parse_args()
    print(f"machine: {hardware.describe_line()}", flush=True)
    table = rows(args.run, args.old_src)
    times: dict[str, list[float]] = {name: [] for name, _, _ in table}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in table}
    outputs = {}
    timed(table[-1][1], table[-1][2], args.threads)  # once untimed: the files in the page cache, as for the rest
    for _ in range(args.rounds):
        for name, argv, path in table:
            seconds, cpu_seconds, outputs[name] = timed(argv, path, args.threads)
            times[name].append(seconds)
            cpu[name].append(cpu_seconds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    cpu_medians = {name: statistics.median(t) for name, t in cpu.items()}
    torch_alone, torch_cpu = medians[table[1][0]], cpu_medians[table[1][0]]
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads else "torch's threads"
    print(f"\nmedians of {args.rounds} rounds, {threads}; translation: {outputs[table[3][0]]!r}\n")
    print("| command | wall seconds | x `import torch` | CPU seconds | x `import torch` |")
    print("|---|---|---|---|---|")
    for name, _, _ in table:
        print(f"| {name} | {medians[name]:.2f} | {medians[name] / torch_alone:.2f} | {cpu_medians[name]:.2f} | "
              f"{cpu_medians[name] / torch_cpu:.2f} |")
    if args.out:
        results = {"machine": hardware.describe(), "rounds": args.rounds, "run": args.run, "threads": args.threads,
                   "medians": medians, "times": times, "cpu_medians": cpu_medians, "cpu_times": cpu}
        Path(args.out).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
