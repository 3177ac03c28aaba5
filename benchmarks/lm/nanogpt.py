"""nanoGPT and this project side by side on Tiny Shakespeare (characters), in one run.

nanoGPT is the peer: its own, unchanged ``train.py`` and ``model.py`` from the folder given
as ``--peer`` (a clone of karpathy/nanoGPT), run as a subprocess with the arguments of its
README's CPU recipe (or ``--peer-args``); ours is ``transformer train`` with a config
(default ``configs/shakespeare-char.yaml``, the same model, data, batch, schedule and token
budget). The two take turns (``--rounds``), and the table gives for each: the validation loss
as the peer reports it (an estimate from ``eval_iters`` random batches), the validation loss
of its final weights on every validation character (the same fixed windows for both, so the
two numbers compare exactly), the median milliseconds per update, training tokens per second
and the ratio of ours to the peer's.

    TRANSFORMER_DATA=DATA_DIR .venv/bin/python benchmarks/lm/nanogpt.py --peer PATH/TO/nanoGPT \\
        [--config configs/shakespeare-char.yaml] [--set KEY=VALUE ...] [--peer-args "--max_iters=2000 ..."] \
        [--variant KEY=VALUE[,KEY=VALUE] ...]

``--variant`` adds a run of ours per round with more overrides (e.g. ``compile=true``), so
that two settings of ours and the peer are measured side by side in one run.

The peer's ``data/shakespeare_char/prepare.py`` runs on a copy of Tiny Shakespeare in a
temporary folder (a stand-in ``requests`` module is given to it when none is installed: the
text is there, nothing is downloaded).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer import hardware

REPO = Path(__file__).resolve().parents[2]
CPU_RECIPE = ("--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 "
              "--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0")


def prepare_peer(peer: Path, text: Path, work: Path) -> Path:
    """A private copy of the peer with its character data prepared from ``text``."""
    dst = work / "nanoGPT"
    shutil.copytree(peer, dst, ignore=shutil.ignore_patterns(".git", "out-*", "*.bin", "*.pkl"))
    data = dst / "data" / "shakespeare_char"
    shutil.copy(text, data / "input.txt")
    stub = work / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "requests.py").write_text("def get(url):\n    raise RuntimeError('no network: ' + url)\n")
    env = {**os.environ, "PYTHONPATH": str(stub)}
    subprocess.run([sys.executable, "prepare.py"], cwd=data, env=env, check=True, capture_output=True)
    return dst


def run_peer(peer: Path, args: str, out_dir: Path) -> dict:
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *shlex.split(args), f"--out_dir={out_dir}"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=peer, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    evals = [(int(s), float(v)) for s, v in re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", done.stdout)]
    times = [float(t) for t in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", done.stdout)]
    block, batch = _arg(args, "block_size", 256), _arg(args, "batch_size", 64)
    ms = statistics.median(times[1:])  # the first update includes start-up
    return {"reported_val": evals[-1][1], "ms_per_update": ms, "tokens_per_s": block * batch / ms * 1000,
            "wall_s": wall, "updates": len(times), "checkpoint": out_dir / "ckpt.pt"}


def run_ours(config: str, overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "transformer", "train", "--config", config, "--out", str(run_dir),
           "--set", "progress=false", *[a for o in overrides for a in ("--set", o)]]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "event" not in r and "loss" in r]
    evals = [r for r in recs if r.get("event") == "eval"]
    stop = next(r for r in recs if r.get("event") == "stop")
    tps = statistics.median(r["tgt_tokens_per_s"] for r in train[1:])  # windows with an evaluation are slower
    from transformer.train.train_config import load_config

    cfg = load_config(run_dir / "config.yaml")
    per_update = cfg.batch_size * (cfg.context or cfg.model_config(vocab_size=8).max_len)
    return {"reported_val": evals[-1]["valid_nll"], "tokens_per_s": tps, "ms_per_update": per_update / tps * 1000,
            "wall_s": wall, "updates": stop["step"], "train_minutes": stop["train_minutes"], "run": run_dir}


@torch.no_grad()
def peer_exact_val(peer: Path, checkpoint: Path, text: Path, context: int, device: str = "cpu") -> float:
    """The peer's final weights scored on every validation character, in our fixed windows (on ``device``)."""
    sys.path.insert(0, str(peer))
    from model import GPT, GPTConfig  # the peer's own model code

    from transformer.data.text import validation_windows

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)  # the peer's own file, just written
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.eval().to(device)
    data = text.read_text(encoding="utf-8")
    chars = sorted(set(data))
    stoi = {c: i for i, c in enumerate(chars)}
    val = torch.tensor([stoi[c] for c in data[int(len(data) * 0.9):]])
    total, n = 0.0, 0
    for start, first in validation_windows(len(val), context):
        x, y = val[start:start + context][None].to(device), val[start + 1:start + context + 1].to(device)
        logits, _ = model(x, y[None])  # with targets the peer returns every position's logits
        lp = torch.log_softmax(logits[0].float(), -1)[first:]
        total -= float(lp.gather(1, y[first:, None]).sum())
        n += len(y) - first
    return total / n


def _arg(args: str, name: str, default: int) -> int:
    m = re.search(rf"--{name}=(\d+)", args)
    return int(m.group(1)) if m else default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", required=True, help="a nanoGPT folder (train.py, model.py, config/, data/)")
    ap.add_argument("--text", default=None, help="Tiny Shakespeare (default: $TRANSFORMER_DATA/tinyshakespeare/input.txt)")
    ap.add_argument("--config", default="configs/shakespeare-char.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--peer-args", default=CPU_RECIPE)
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="one more run of ours per round, with these overrides added")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    print(f"machine: {hardware.describe_line()}", flush=True)
    text = Path(args.text or Path(os.environ.get("TRANSFORMER_DATA", "")) / "tinyshakespeare" / "input.txt")
    work = Path(tempfile.mkdtemp(prefix="nanogpt-bench."))
    peer = prepare_peer(Path(args.peer), text, work)
    rows = []
    systems = ["peer", "ours"] + [f"ours {v}" for v in args.variant]
    for r in range(args.rounds):
        order = systems if r % 2 == 0 else systems[::-1]
        for who in order:
            print(f"round {r + 1}: {who} ...", file=sys.stderr, flush=True)
            if who == "peer":
                res = run_peer(peer, args.peer_args, work / f"peer-{r}")
                res["exact_val"] = peer_exact_val(peer, res.pop("checkpoint"), text, _arg(args.peer_args, "block_size", 256))
            else:
                extra = who.removeprefix("ours").strip()
                overrides = args.overrides + (extra.split(",") if extra else [])
                res = run_ours(args.config, overrides, work / f"{who.replace(' ', '-')}-{r}")
                res["exact_val"] = res["reported_val"]  # ours scores every validation character
                res["run"] = str(res["run"])
            rows.append({"who": who, "round": r + 1, **res})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; peer args: {args.peer_args}; "
          f"ours: {args.config} {' '.join(args.overrides)}\n")
    print("| round | system | updates | val loss as reported | val loss, every character | ms / update | tokens/s | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        ms = row["ms_per_update"]
        print(f"| {row['round']} | {'nanoGPT' if row['who'] == 'peer' else row['who']} | {row['updates']} | "
              f"{row['reported_val']:.4f} | {row['exact_val']:.4f} | {ms:.1f} | {row['tokens_per_s']:,.0f} | "
              f"{row['wall_s']:.0f} |")
    for r in range(args.rounds):
        peer_row = next(x for x in rows if x["round"] == r + 1 and x["who"] == "peer")
        for who in systems[1:]:
            ours_row = next(x for x in rows if x["round"] == r + 1 and x["who"] == who)
            print(f"round {r + 1}: {who} / nanoGPT tokens/s = {ours_row['tokens_per_s'] / peer_row['tokens_per_s']:.2f}x; "
                  f"validation loss difference ({who} - nanoGPT, every character) = "
                  f"{ours_row['exact_val'] - peer_row['exact_val']:+.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": hardware.describe(), "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
