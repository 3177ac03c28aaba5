"""Decoding on a CPU keeps the memory it frees for its next step instead of handing it back to
the system.

Every decoding step makes and frees tensors of megabytes: logits, log-probabilities, each
layer's self-attention K and V grown by a position and reordered by the beams. By default
glibc maps a block over its mmap threshold (which adapts, up to 32 MiB) fresh from the system
and unmaps it when freed, and gives back the top of its heap once more than twice that
threshold is free there; either way the next step's tensors fault their pages in again, zeroed
by the kernel. Measured on an AMD EPYC (1 thread, an opus-mt-sized model, 50 sentences, beam
4, fp32): 26.8 CPU s as it was, 22.4 s with the threshold at its largest and the heap kept
(benchmarks/decode/README.md, "the output projection in chunks, freed memory kept").

:func:`keep_freed_memory` sets that once per process, through glibc's ``mallopt``: the mmap
threshold at 32 MiB and the heap's top kept up to 1 GiB. A process that decodes then holds
its peak memory until it exits, as allocators built for speed (jemalloc, tcmalloc) do. Left
alone: another C library, an allocator preloaded (``LD_PRELOAD``), any ``MALLOC_*`` variable
in the environment (the user's own tuning), and ``TRANSFORMER_MALLOC=system``.
"""
from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30

_done: bool | None = None  # (once per process)


def left_alone(environ=os.environ, libc_name: str | None = None) -> str | None:
    """Why the allocator is left as it is, or None when it may be set."""
    if environ.get("TRANSFORMER_MALLOC", "").strip().lower() == "system":
        return "TRANSFORMER_MALLOC=system"
    if (tuned := sorted(k for k in environ if k.startswith("MALLOC_"))):
        return f"{tuned[0]} is set"
    if environ.get("LD_PRELOAD", "").strip():
        return "an allocator may be preloaded (LD_PRELOAD)"
    if (libc_name if libc_name is not None else platform.libc_ver()[0]) != "glibc":
        return "not glibc"
    return None


def keep_freed_memory(libc=None, environ=os.environ) -> bool:
    """Set glibc to keep freed memory for reuse (see the module's text), once per process;
    True when it is set. ``libc``: the C library to call (default: this process's)."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if left_alone(environ, None if libc is None else "glibc") is None:
        try:
            libc = ctypes.CDLL("libc.so.6") if libc is None else libc
            _done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        except (OSError, AttributeError):  # no such library or symbol: nothing set
            _done = False
    return _done
