"""The service against requests and connections meant to hurt it, and whether ``/health``
is answered meanwhile:

  idle:    230 connections that send nothing (the default connection limit is 224), then
           ten ``/health`` requests: their statuses and latencies;
  fields:  8 clients posting, again and again for 3 s, a 1 MB body of 90,000 unknown keys,
           while another asks for ``/health`` every 10 ms: the 422's size, and /health's
           latencies beside the idle server's;
  work:    a ``/translate`` of 64 texts x 1,000 characters at beam 16 with n_best 16, and a
           one-sentence request sent 0.5 s after it: each one's status and seconds.

The model is the demo's (configs/demo.yaml: preset tiny, Multi30k subwords of 8,000) after
one update (or --model RUN): it never ends a sentence early, so what a request holds the
model here is the most it can. With
``--old REV`` a server of that git revision (a worktree made here and removed again) runs on
the same model after the current one, so the two are measured in the same run.

    .venv/bin/python benchmarks/serve/abuse.py
    .venv/bin/python benchmarks/serve/abuse.py --old 0e6e126

Bounded: one update of training, three attacks per server, two servers at most, a request
given up after --give-up seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from transformer import hardware

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMER = str(Path(sys.executable).with_name("transformer"))
LONG = ("A man in a blue shirt is riding a bike down the street while two dogs play in the park. " * 12)[:1000]


def make_run(folder: Path) -> Path:
    """The demo's model (configs/demo.yaml: preset tiny, Multi30k en-de) after one update."""
    run = folder / "run"
    subprocess.run([TRANSFORMER, "train", "--config", str(ROOT / "configs" / "demo.yaml"), "--out", str(run),
                    *(a for key in ("model.preset=tiny", "train_limit=10000", "max_steps=1", "eval_every=1",
                                    "save_every=1", "valid_limit=2", "progress=false", "precision=fp32")
                      for a in ("--set", key))], check=True, capture_output=True)
    return run


def start(run: Path, log: Path, env: dict[str, str], *options: str) -> tuple[subprocess.Popen, str]:
    """``transformer serve`` of ``run`` on a free port, one thread, with ``options`` (attention_limits.py
    uses it too), under ``env`` (another version's source on PYTHONPATH), logging to ``log``; the
    process and its URL once /health answers."""
    out = open(log, "wb")
    proc = subprocess.Popen([TRANSFORMER, "serve", "--model", str(run), "--port", "0", "--threads", "1", *options],
                            stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("transformer serve: http://"):
                url = line.split()[2].split("#")[0].rstrip("/")
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        return proc, url
                except httpx.HTTPError:
                    pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start:\n{log.read_text()}")


@contextlib.contextmanager
def versions(tmp: Path, old: str | None):
    """[(name, environment)] to serve with: the current source, and with ``old`` that git
    revision's, checked out in ``tmp/old`` while the block runs (attention_limits.py uses it too)."""
    found = [("current", {**os.environ, "OMP_NUM_THREADS": "1"})]
    if old:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp / "old"), old], check=True,
                       capture_output=True)
        found.append((old, {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp / "old" / "src")}))
    try:
        yield found
    finally:
        if old:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "old")],
                           capture_output=True)
            shutil.rmtree(tmp / "old", ignore_errors=True)


def health(http: httpx.Client, url: str) -> tuple[int, float]:
    t = time.perf_counter()
    status = http.get(url + "/health").status_code
    return status, time.perf_counter() - t


def idle(url: str) -> str:
    parts = urlsplit(url)
    socks = [socket.create_connection((parts.hostname, parts.port)) for _ in range(230)]
    try:
        time.sleep(0.5)  # accepted
        with httpx.Client(timeout=60) as http:
            answers = [health(http, url) for _ in range(10)]
    finally:
        for s in socks:
            s.close()
    statuses = sorted({s for s, _ in answers})
    return f"/health {'/'.join(map(str, statuses))}, p50 {statistics.median(t for _, t in answers) * 1e3:.1f} ms"


def fields(url: str, seconds: float = 3.0) -> str:
    body = json.dumps({"text": "A dog.", **{f"{i:x}": 0 for i in range(90_000)}}, separators=(",", ":")).encode()
    stop, during, sizes = threading.Event(), [], []

    def post() -> None:
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                r = http.post(url + "/translate", content=body, headers={"Content-Type": "application/json"})
                sizes.append(len(r.content))

    with httpx.Client(timeout=60) as http:
        quiet = [health(http, url)[1] for _ in range(20)]
        posters = [threading.Thread(target=post) for _ in range(8)]
        for p in posters:
            p.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            during.append(health(http, url)[1])
            time.sleep(0.01)
        stop.set()
        for p in posters:
            p.join()
    return (f"422 of {max(sizes) / 1e3:,.1f} kB, {len(sizes)} answered; /health p50 "
            f"{statistics.median(during) * 1e3:.0f} ms, max {max(during) * 1e3:.0f} ms "
            f"(idle p50 {statistics.median(quiet) * 1e3:.1f} ms)")


def work(url: str, give_up: float) -> str:
    results = {}

    def send(name: str, body: dict) -> None:
        t = time.perf_counter()
        try:
            status = httpx.post(url + "/translate", json=body, timeout=give_up).status_code
        except httpx.TimeoutException:
            status = f"none in {give_up:g} s"
        results[name] = (status, time.perf_counter() - t)

    big = threading.Thread(target=send, args=("heavy", {"texts": [LONG] * 64, "beam": 16, "n_best": 16}))
    big.start()
    time.sleep(0.5)
    send("small", {"text": "Two dogs play in the snow."})
    big.join()
    (s1, t1), (s2, t2) = results["heavy"], results["small"]
    return f"{s1} in {t1:.2f} s; a sentence after it {s2} in {t2:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", metavar="REV", help="also serve with this git revision, after the current one")
    ap.add_argument("--model", metavar="RUN", help="serve this run instead (e.g. runs/demo)")
    ap.add_argument("--give-up", type=float, default=180.0, metavar="SECONDS",
                    help="a request not answered by then is reported as such (default: 180)")
    ap.add_argument("--json", metavar="FILE", help="also write each server's row there, with the machine")
    args = ap.parse_args()
    rows = []
    print(hardware.describe_line())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = Path(args.model) if args.model else make_run(tmp)
        with versions(tmp, args.old) as servers:
            print("| server | 230 idle connections | 8 clients x 90,000 unknown keys | /translate of 64 x 1,000 characters "
                  "at beam 16 |")
            print("|---|---|---|---|", flush=True)
            for name, env in servers:
                proc, url = start(run, tmp / f"{name}.log", env)
                try:
                    row = {"server": name, "idle": idle(url), "fields": fields(url), "work": work(url, args.give_up)}
                    rows.append(row)
                    print(f"| {name} | {row['idle']} | {row['fields']} | {row['work']} |", flush=True)
                finally:
                    proc.terminate()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:  # a decode call of the old server's still running
                        proc.kill()
                        proc.wait()
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": hardware.describe(), "rows": rows}, indent=1) + "\n",
                                   encoding="utf-8")


if __name__ == "__main__":
    main()
