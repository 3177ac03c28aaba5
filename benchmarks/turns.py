"""A system's turn in a side-by-side race. A CTranslate2 model slows every torch system in
its process while it is alive (benchmarks/lm/README.md: ours 1.8x eager and 2.9x compiled,
HF 1.7x, measured by benchmarks/lm/neighbour.py), so the races load it for its own turn only:
such a system has ``open`` (load) and ``close`` (delete), run untimed around its turn."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def its_turn(system):
    """``system`` opened for the block (when it has ``open``), and closed after it, also when
    the block fails (when it has ``close``)."""
    if hasattr(system, "open"):
        system.open()
    try:
        yield system
    finally:
        if hasattr(system, "close"):
            system.close()
