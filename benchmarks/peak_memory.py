"""Peak memory of this process, for the benchmarks that measure each system in a fresh process
(`train_throughput.py --memory`, `decode/run.py` part M). Imports nothing heavy, so that a
child process's own imports are what it measures."""
from __future__ import annotations

from pathlib import Path


def peak_rss_mib() -> float:
    """VmHWM of /proc/self/status: this process's peak resident memory since exec, in MiB.
    (getrusage's ru_maxrss is kept across fork + exec on Linux, so a child would report its
    parent's peak; it is no substitute.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory is measured on Linux only")
