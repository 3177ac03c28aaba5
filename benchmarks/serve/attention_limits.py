"""What one ``/attention`` request costs the server, and whether ``/health`` is answered
meanwhile: the review's request (1,000 characters to a 4-layer, 8-head character model with a
1,024-token context: 32 million weights) and the largest one the default ``--max-attention``
allows on that model (250 tokens: 2,000,000 weights), each sent while another client asks for
``/health`` every 10 ms.

For each request: its status, seconds to the answer, the answer's size, the server's resident
memory before it and its peak (VmHWM) after, and the ``/health`` latencies during it (median,
max) beside those of the idle server in the same run. With ``--old REV`` a server of that git
revision (a worktree made here and removed again) runs beside the current one on the same
model, so the two are measured side by side.

    .venv/bin/python benchmarks/serve/attention_limits.py
    .venv/bin/python benchmarks/serve/attention_limits.py --old 1a38599

Bounded: one model trained for one update, two requests per server, two servers at most.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from abuse import start, versions  # benchmarks/serve/ is the script's own folder, first on sys.path
from transformer import hardware

TRANSFORMER = str(Path(sys.executable).with_name("transformer"))
SENTENCE = "a cat sat on the mat and the dog ran under the log. "


def make_run(folder: Path) -> Path:
    """A character model of the review's shape (4 layers, 8 heads, context 1,024), one update."""
    text = folder / "text.txt"
    text.write_text(SENTENCE * 400, encoding="utf-8")
    run, config = folder / "run", folder / "model.yaml"
    config.write_text(f"dataset: text\ntext_files: [{text}]\ntokenizer: chars\nmodel: {{preset: nanogpt-char, "
                      "n_layers: 4, n_heads: 8, d_model: 64, d_ff: 128, max_len: 1024}\nbatch_size: 2\n"
                      "max_steps: 1\neval_every: 1\nsave_every: 1\nvalid_fraction: 0.3\nprogress: false\n"
                      "precision: fp32\n", encoding="utf-8")
    subprocess.run([TRANSFORMER, "train", "--config", str(config), "--out", str(run)], check=True, capture_output=True)
    return run


def memory(pid: int) -> tuple[float, float]:
    """(resident MB now, peak resident MB) of a process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def health_times(url: str, n: int = 30) -> list[float]:
    times = []
    with httpx.Client(timeout=60) as http:
        for _ in range(n):
            t = time.perf_counter()
            http.get(url + "/health")
            times.append(time.perf_counter() - t)
            time.sleep(0.01)
    return times


def measure(url: str, pid: int, text: str) -> dict:
    stop, during = threading.Event(), []

    def poll() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                t = time.perf_counter()
                http.get(url + "/health")
                during.append(time.perf_counter() - t)
                time.sleep(0.01)

    before, _ = memory(pid)
    poller = threading.Thread(target=poll)
    poller.start()
    t = time.perf_counter()
    r = httpx.post(url + "/attention", json={"text": text}, timeout=600)
    seconds = time.perf_counter() - t
    stop.set()
    poller.join()
    _, peak = memory(pid)
    return {"status": r.status_code, "seconds": seconds, "bytes": len(r.content), "rss_before": before,
            "peak": peak, "health_p50": statistics.median(during) if during else float("nan"),
            "health_max": max(during) if during else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", metavar="REV", help="also serve with this git revision, side by side")
    args = ap.parse_args()
    print(hardware.describe_line())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = make_run(tmp)
        rows = []
        with versions(tmp, args.old) as servers:
            for name, env in servers:
                proc, url = start(run, tmp / f"{name}.log", env, "--max-chars", "1000")
                try:
                    idle = health_times(url)
                    for label, text in (("largest allowed: 250 tokens", (SENTENCE * 5)[:250]),
                                        ("the review's: 1,000 tokens", (SENTENCE * 20)[:1000])):
                        rows.append((name, label, measure(url, proc.pid, text), statistics.median(idle)))
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    print("| server | request | status | answer s | answer MB | RSS before MB | peak RSS MB | /health p50 ms "
          "(idle) | /health max ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, label, m, idle in rows:
        print(f"| {name} | {label} | {m['status']} | {m['seconds']:.2f} | {m['bytes'] / 1e6:.1f} | "
              f"{m['rss_before']:.0f} | {m['peak']:.0f} | {m['health_p50'] * 1e3:.1f} ({idle * 1e3:.1f}) | "
              f"{m['health_max'] * 1e3:.0f} |")


if __name__ == "__main__":
    main()
