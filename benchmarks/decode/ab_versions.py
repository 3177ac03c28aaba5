"""Decoding with two versions of this code, side by side: the same run, the same sentences,
greedy and beam 4. By default the compiled step, one sentence at a time (its case), fp32;
``--compile off --batched`` the eager searches over the sentences in the translator's own
batches (``--precision`` as given, default fp32).

Each version is a ``git worktree`` of a revision; the versions take turns, one process per
turn (a package of generated code is loaded once per process), and only the searches are
timed. The step is built by a first, untimed turn of each version.

    .venv/bin/python benchmarks/decode/ab_versions.py --run runs/demo --old 05ab160 --new HEAD [--n 64] [--rounds 5]
        [--compile off --batched --precision auto]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TURN = r"""
import gzip, json, os, sys, time, warnings
import torch
warnings.filterwarnings("ignore")
torch.set_num_threads(int(sys.argv[4]))
import transformer
assert transformer.__file__.startswith(os.getcwd()), transformer.__file__  # this version's code
from transformer import Translator
lines = gzip.open(sys.argv[2], "rt", encoding="utf-8").read().splitlines()[: int(sys.argv[3])]
out = {}
compile, precision, batched = sys.argv[5], sys.argv[6], sys.argv[7] == "1"
for beam in (1, 4):
    t = Translator.from_pretrained(sys.argv[1], beam=beam, precision=precision, compile=compile)
    t.translate(lines[:1])  # load (or build) the package
    start = time.perf_counter()
    texts = t.translate(lines) if batched else [t.translate([line])[0] for line in lines]
    out[f"beam{beam}"] = [time.perf_counter() - start, texts]
print(json.dumps(out))
"""


def worktree(rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def turn(tree: Path, args, data: Path) -> dict:
    env = {"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(args.threads),
           "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-c", TURN, str(Path(args.run).resolve()), str(data), str(args.n),
                           str(args.threads), args.compile, args.precision, str(int(args.batched))],
                          capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode != 0:
        sys.exit(f"{tree}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a translation run directory")
    ap.add_argument("--old", required=True, help="a git revision")
    ap.add_argument("--new", default="HEAD", help="a git revision (default HEAD)")
    ap.add_argument("--data-dir", default=None, help="the folder holding multi30k/ (default $TRANSFORMER_DATA)")
    ap.add_argument("--n", type=int, default=64, help="test_2016_flickr sentences")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", default="on", choices=("on", "off"), help="the compiled step or the eager one")
    ap.add_argument("--precision", default="fp32", help="decoding precision (default fp32)")
    ap.add_argument("--batched", action="store_true", help="all sentences in one call, in the translator's batches")
    ap.add_argument("--json", help="also write the times here, with the machine (transformer.hardware)")
    args = ap.parse_args()
    import os

    from transformer import hardware

    print(f"machine: {hardware.describe_line()}", flush=True)
    data = Path(args.data_dir or os.environ.get("TRANSFORMER_DATA", "")) / "multi30k" / "test_2016_flickr.en.gz"
    if not data.is_file():
        sys.exit(f"{data}: not found; give --data-dir or set TRANSFORMER_DATA")
    with tempfile.TemporaryDirectory(prefix="ab-versions.") as tmp:
        trees = {name: worktree(rev, Path(tmp)) for name, rev in (("old", args.old), ("new", args.new))}
        try:
            first = {name: turn(tree, args, data) for name, tree in trees.items()}  # builds the steps
            times: dict[str, dict[str, list[float]]] = {n: {"beam1": [], "beam4": []} for n in trees}
            for r in range(args.rounds):
                for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    for search, (seconds, _) in turn(trees[name], args, data).items():
                        times[name][search].append(seconds)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    how = "in the translator's batches" if args.batched else "one at a time"
    step = "compiled step" if args.compile == "on" else "eager step"
    print(f"\n{args.n} sentences {how}, {args.precision}, {step}, {args.threads} thread(s), {args.rounds} rounds "
          f"(medians); old {args.old}, new {args.new}\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": hardware.describe(), "args": vars(args), "times": times},
                                              indent=1), encoding="utf-8")
    print("| search | old, s | new, s | new / old | same translations |")
    print("|---|---|---|---|---|")
    for search in ("beam1", "beam4"):
        old, new = statistics.median(times["old"][search]), statistics.median(times["new"][search])
        same = sum(a == b for a, b in zip(first["old"][search][1], first["new"][search][1]))
        print(f"| {'greedy' if search == 'beam1' else 'beam 4'} | {old:.2f} | {new:.2f} | {new / old:.3f} | "
              f"{same}/{args.n} |")


if __name__ == "__main__":
    main()
