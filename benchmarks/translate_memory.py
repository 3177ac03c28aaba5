"""Peak memory of `transformer translate` against the length of its input: a streamed
translation holds one chunk of lines at a time, so its peak must not grow with the input.

The input is synthetic: Multi30k's English training sentences repeated to N lines (written
to a temporary folder). The model is a toy one (`toy` preset, a 1,000-subword vocabulary,
200 training updates: its translations are poor, which does not matter for memory) decoded
greedily with at most 20 target subwords a line, so that a large input finishes on a shared
CPU. Each size runs `transformer translate --input IN --output OUT` in a fresh child process
that reports its own peak resident memory at exit (VmHWM, see peak_memory.py), one intra-op
thread. `--old-src` runs the same command on another source tree too (e.g. the
non-streaming version before this change, unpacked with `git archive COMMIT src | tar -x -C OLD`),
and checks that both wrote the same translations.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/translate_memory.py \\
        [--sizes 10000,100000,1000000] [--old-src OLD/src] [--run RUN] [--out results.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
SRC = BENCHMARKS.parent / "src"

TOY_RUN = {
    "dataset": "multi30k", "src_lang": "en", "tgt_lang": "de", "vocab_size": 1000,
    "model": {"preset": "toy"}, "max_tokens": 2048, "max_steps": 200, "lr_schedule": "inverse_sqrt",
    "peak_lr": 0.003, "warmup": 50, "eval_every": 200, "valid_limit": 50, "save_every": 200, "keep_last": 1,
    "log_every": 100, "progress": False, "threads": 1, "precision": "fp32", "seed": 1,
    "decoding": {"beam": 1, "max_len_a": 0.0, "max_len_b": 20},  # greedy, at most 20 subwords a line
}


def child(result: Path, argv: list[str]) -> None:
    """Run one `transformer` command in this process, then record its exit code and peak RSS."""
    sys.path.insert(0, str(BENCHMARKS))
    from peak_memory import peak_rss_mib

    from transformer.cli import main

    code = main(argv)
    result.write_text(json.dumps({"code": code, "peak_rss_mib": peak_rss_mib()}))


def train_toy_run(workdir: Path) -> Path:
    import yaml

    config, run = workdir / "toy.yaml", workdir / "toy-run"
    config.write_text(yaml.safe_dump(TOY_RUN), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "transformer", "train", "--config", str(config), "--out", str(run)],
                          env=_env(SRC), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"training the toy run failed:\n{done.stderr[-2000:]}")
    return run


def write_input(path: Path, n: int, sentences: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, len(sentences)):
            f.write("".join(s + "\n" for s in sentences[: min(len(sentences), n - start)]))


def measure(src: Path, run: Path, source: Path, out: Path) -> dict:
    """One `transformer translate` in a fresh process on source tree ``src``."""
    result = out.with_suffix(".json")
    argv = ["translate", "--model", str(run), "--input", str(source), "--output", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(result), *argv],
                          env=_env(src), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode or not result.exists():
        sys.exit(f"translate failed ({src}):\n{done.stderr[-2000:]}")
    info = json.loads(result.read_text())
    digest, lines = hashlib.sha256(), 0
    with open(out, "rb") as f:
        for line in f:
            digest.update(line)
            lines += 1
    out.unlink()
    return {**info, "seconds": round(seconds, 1), "output_lines": lines, "sha256": digest.hexdigest()}


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000", help="input lengths in lines, comma-separated")
    p.add_argument("--old-src", type=Path, help="another source tree (its src folder) to measure the same way")
    p.add_argument("--run", type=Path, help="a translation run to use instead of training the toy one")
    p.add_argument("--workdir", type=Path, help="where the inputs go (default: a temporary folder, removed)")
    p.add_argument("--out", type=Path, help="also write the results here (JSON)")
    args = p.parse_args()
    sys.path.insert(0, str(SRC))
    from transformer import hardware
    from transformer.data import load_multi30k

    print(f"machine: {hardware.describe_line()}", flush=True)

    sizes = [int(s) for s in args.sizes.split(",")]
    trees = {"streamed": SRC, **({"old": args.old_src.resolve()} if args.old_src else {})}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        workdir = Path(tmp)
        run = args.run or train_toy_run(workdir)
        sentences = [s for s, _ in load_multi30k("train", "en", "de", download=False)]
        rows = []
        for n in sizes:
            source = workdir / f"input-{n}.en"
            write_input(source, n, sentences)
            for name, src in trees.items():
                row = {"lines": n, "tree": name, **measure(src, run, source, workdir / f"out-{n}-{name}.de")}
                rows.append(row)
                print(json.dumps(row), flush=True)
            source.unlink()
    if args.out:
        args.out.write_text(json.dumps({"machine": hardware.describe(), "rows": rows}, indent=1) + "\n",
                            encoding="utf-8")
    print("\n| lines | tree | peak RSS MiB | seconds | output lines | output sha256 (first 12) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['lines']:,} | {r['tree']} | {r['peak_rss_mib']:.0f} | {r['seconds']:.0f} | "
              f"{r['output_lines']:,} | {r['sha256'][:12]} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # benchmarks/translate_memory.py --child RESULT transformer-argv...
        child(Path(sys.argv[2]), sys.argv[3:])
    else:
        main()
