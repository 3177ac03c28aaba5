"""Load on ``transformer serve``: requests/s and p50/p99 latency at 1, 8 and 32 concurrent
clients, with and without dynamic batching, and how many requests the server refused (503,
its queue full: ``--max-queue``) or gave up on (504, past ``--timeout``), measured in one run.

Two servers run side by side (subprocesses on free loopback ports), one with dynamic
batching and one with ``--no-batching``; only one is under load at a time. Each cell is
``--seconds`` of closed-loop load (every client sends one request of one sentence, waits for
the answer, sends the next), repeated ``--rounds`` times, the settings interleaved so that
noise from the rest of the machine falls on both alike. Every 200 is checked against the
batching server's answer for the same sentence sent alone (a batching bug shows as "wrong").
requests/s and the latencies count the 200s only; after a 503 a client waits 50 ms (not the
whole Retry-After: the cell would mostly measure sleeping) and sends its next request.

    .venv/bin/python benchmarks/serve/load.py                 # runs/demo if it holds weights, else a toy model
    .venv/bin/python benchmarks/serve/load.py --model RUN_DIR --seconds 5 --json out.json

Bounded: rounds x levels x 2 settings x seconds, plus two server start-ups and the last
requests' latency; traffic goes to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from transformer import hardware

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMER = str(Path(sys.executable).with_name("transformer"))

ENGLISH = [  # Multi30k-like sentences for a real en->de model
    "A man in an orange hat starring at something.",
    "A little girl climbing into a wooden playhouse.",
    "Two dogs play in the snow.",
    "A woman is riding a bicycle down the street.",
    "A group of people stand in front of an igloo.",
    "A boy jumps into the water at the beach.",
    "Several men in hard hats are operating a giant pulley system.",
    "A child in a red shirt is playing with a ball.",
    "Two young guys with shaggy hair look at their hands while hanging out in the yard.",
    "A black dog is running through the grass.",
    "People are walking on a busy city street at night.",
    "An older man is playing a guitar on the sidewalk.",
]
TOY_WORDS = ("red blue green small big dog cat bird man woman child runs sits eats sees plays "
             "with near under the a ball tree house car water park street").split()


def has_weights(run: Path) -> bool:
    return any((run / name).is_file() for name in ("averaged.safetensors", "best.safetensors")) or \
        any((run / "checkpoints").glob("step-*/model.safetensors"))


def train_toy(folder: Path) -> Path:
    """The tests' toy model (tests/serve/conftest.py): 200 steps on a synthetic language pair."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in (("train", 400), ("valid", 20)):
        sents = [[rng.choice(TOY_WORDS) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        for side, lines in (("src", [" ".join(s) for s in sents]),
                            ("tgt", [" ".join("x" + w[::-1] for w in s) for s in sents])):
            files[f"{split}_{side}"] = folder / f"{split}.{side}"
            files[f"{split}_{side}"].write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    import yaml

    config = folder / "toy.yaml"
    config.write_text(yaml.safe_dump({
        "dataset": "files", **{k: str(v) for k, v in files.items()}, "vocab_size": 120,
        "model": {"preset": "toy"}, "max_tokens": 512, "lr_schedule": "inverse_sqrt", "peak_lr": 0.005,
        "warmup": 40, "max_steps": 200, "eval_every": 200, "save_every": 200, "keep_last": 1,
        "progress": False, "threads": 1, "precision": "fp32"}))
    subprocess.run([TRANSFORMER, "train", "--config", str(config), "--out", str(folder / "run")],
                   check=True, capture_output=True)
    return folder / "run"


def start_server(model: Path, extra: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([TRANSFORMER, "serve", "--model", str(model), "--port", "0", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server failed:\n{log.read_text()}")
        for line in log.read_text().splitlines():
            if line.startswith("transformer serve: http://"):
                url = line.split()[2].rstrip("/")
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        return proc, url
                except httpx.HTTPError:
                    pass
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"server did not start:\n{log.read_text()}")


BACKOFF_S = 0.05  # a client's pause after a 503


async def closed_loop(url: str, texts: list[str], expected: dict[str, str], clients: int,
                      seconds: float) -> tuple[list[float], dict[str, int], float]:
    """(latencies of the 200s in s, counts of "wrong", 503 and 504 answers, elapsed s) of
    ``clients`` closed-loop clients."""
    latencies: list[float] = []
    counts = {"wrong": 0, "503": 0, "504": 0}
    end = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            while time.perf_counter() < end:
                text = rng.choice(texts)
                start = time.perf_counter()
                r = await http.post("/translate", json={"text": text})
                if r.status_code in (503, 504):
                    counts[str(r.status_code)] += 1
                    if r.status_code == 503:
                        await asyncio.sleep(BACKOFF_S)
                    continue
                latencies.append(time.perf_counter() - start)
                if r.status_code != 200 or r.json()["translation"] != expected[text]:
                    counts["wrong"] += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(1000 * clients + i) for i in range(clients)))
    return latencies, counts, time.perf_counter() - start


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def measure(servers: dict[bool, str], levels: list[int], seconds: float, rounds: int, texts: list[str]) -> list[dict]:
    """Interleaved: for each round, level and setting, ``seconds`` of load; so machine noise
    falls on both settings alike. requests/s is the median over rounds, latency percentiles
    pool every request of a cell."""
    expected = {t: httpx.post(servers[True] + "/translate", json={"text": t}, timeout=120).json()["translation"]
                for t in texts}
    for url in servers.values():  # warm-up, and both servers must agree
        for t in texts:
            assert httpx.post(url + "/translate", json={"text": t}, timeout=120).json()["translation"] == expected[t]
    cells: dict[tuple[int, bool], dict] = {}
    for _ in range(rounds):
        for clients in levels:
            for batching, url in servers.items():
                before = httpx.get(url + "/stats").json()
                lat, counts, elapsed = asyncio.run(closed_loop(url, texts, expected, clients, seconds))
                after = httpx.get(url + "/stats").json()
                cell = cells.setdefault((clients, batching), {"lat": [], "rates": [], "wrong": 0, "503": 0, "504": 0,
                                                              "texts": 0, "calls": 0})
                cell["lat"] += lat
                cell["rates"].append(len(lat) / elapsed)
                for k, n in counts.items():
                    cell[k] += n
                cell["texts"] += after["texts"] - before["texts"]
                cell["calls"] += after["decode_calls"] - before["decode_calls"]
                cell["busy"] = cell.get("busy", 0.0) + after["decode_seconds"] - before["decode_seconds"]
                cell["elapsed"] = cell.get("elapsed", 0.0) + elapsed
                print(f"clients {clients:3d} batching {batching!s:5}: {len(lat) / elapsed:7.1f} requests/s",
                      file=sys.stderr, flush=True)
    rows = []
    for (clients, batching), c in cells.items():
        lat = sorted(c["lat"])
        rows.append({"clients": clients, "batching": batching, "requests": len(lat),
                     "requests_per_s": round(statistics.median(c["rates"]), 1),
                     "p50_ms": round(1000 * percentile(lat, 50), 1), "p99_ms": round(1000 * percentile(lat, 99), 1),
                     "texts_per_decode": round(c["texts"] / max(c["calls"], 1), 2),
                     "model_busy": round(c["busy"] / c["elapsed"], 2), "wrong": c["wrong"],
                     "refused_503": c["503"], "timed_out_504": c["504"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="run directory (default: runs/demo if it holds weights, else a toy model)")
    ap.add_argument("--levels", default="1,8,32", help="concurrent clients, comma-separated")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per level, setting and round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all levels and settings")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--max-queue", type=int, default=128, help="the servers' --max-queue (a 503 beyond it)")
    ap.add_argument("--timeout", type=float, default=60.0, help="the servers' --timeout in seconds (a 504 past it)")
    ap.add_argument("--sentences", choices=["auto", "english", "toy"], default="auto",
                    help="what to translate (auto: toy sentences for the toy model, else English)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    print(f"machine: {hardware.describe_line()}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    demo = ROOT / "runs" / "demo"
    if args.model:
        model, kind = Path(args.model), "given"
    elif has_weights(demo):
        model, kind = demo, "runs/demo (real en->de run)"
    else:
        print("runs/demo holds no weights: training the toy model (about 10 s)", file=sys.stderr)
        model, kind = train_toy(tmp / "toy"), "toy (synthetic language pair, d_model 64, 2+2 layers)"
    toy = args.sentences == "toy" or (args.sentences == "auto" and kind.startswith("toy"))
    rng = random.Random(0)
    texts = [" ".join(rng.choices(TOY_WORDS, k=rng.randint(3, 8))) for _ in range(12)] if toy else ENGLISH
    levels = [int(x) for x in args.levels.split(",")]
    server_args = ["--beam", str(args.beam), "--threads", str(args.threads), "--max-batch", str(args.max_batch),
                   "--max-wait-ms", str(args.max_wait_ms), "--max-queue", str(args.max_queue),
                   "--timeout", str(args.timeout)]

    load_before = f"{os.getloadavg()[0]:.1f}"  # other work on the machine skews every number
    servers, procs = {}, []
    try:
        for batching in (True, False):
            proc, servers[batching] = start_server(model, server_args + ([] if batching else ["--no-batching"]),
                                                   tmp / f"server-{batching}.log")
            procs.append(proc)
        rows = measure(servers, levels, args.seconds, args.rounds, texts)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)

    print(f"\nmodel: {model} ({kind}); beam {args.beam}; server threads {args.threads}; "
          f"max batch {args.max_batch}, max wait {args.max_wait_ms} ms, max queue {args.max_queue}, "
          f"timeout {args.timeout} s; {args.rounds} x {args.seconds} s per cell; "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {platform.python_implementation()} "
          f"{platform.python_version()}; load average {load_before} before, {os.getloadavg()[0]:.1f} after\n")
    print("| clients | batching | requests/s (200) | p50 ms | p99 ms | 503 | 504 | texts per decode call | model busy "
          "| wrong |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["clients"], not r["batching"])):
        print(f"| {r['clients']} | {'yes' if r['batching'] else 'no'} | {r['requests_per_s']} | {r['p50_ms']} | "
              f"{r['p99_ms']} | {r['refused_503']} | {r['timed_out_504']} | {r['texts_per_decode']} | "
              f"{r['model_busy']:.0%} | {r['wrong']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(model), "kind": kind, "args": vars(args), "rows": rows,
                                               "machine": hardware.describe()},
                                              indent=2))


if __name__ == "__main__":
    main()
