"""Training's ``precision: auto`` on a CPU, measured rather than read from its flags.

Where the CPU computes bf16 natively, bf16 autocast is not always the faster: measured on an
AVX512-BF16 CPU without AMX, training the language model in bf16 and in fp32 came out within
the noise of each other, and at the demo model's width fp32 products can beat bf16 ones
(``benchmarks/decode/README.md``). So, on the first run of a recipe on a machine, a few
updates of the recipe's own model (copies of it, with their own optimizer) on a batch of its
shape (:func:`typical_batch`) are timed in each precision, taking turns, on one thread in CPU
time; the faster is chosen and the times kept in the private cache decoding's choices live in
(:func:`transformer.decode.choose.kept_times`: the same file, keyed by the CPU and torch), so a
later run of the recipe reads them back. The log says what was chosen and the measured rates.

The flags decide, with no timing, on a GPU (bf16 where native, else fp16), where the CPU
emulates bf16 (fp32: emulated bf16 is many times slower), with several processes (each must
train in the same precision), and under ``TRANSFORMER_MEASURE=off``; where measuring fails,
with one line in the log. The run's random state is left as it was: resuming stays exact.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import time
import warnings

import torch
from torch import nn

from .. import hardware
from ..data import collate
from ..data.text import windows
from ..decode import choose
from .update import make_optimizer, resolve_precision, train_step

UPDATES = 3  # timed updates per precision, after one warm-up each
PRECISIONS = ("fp32", "bf16")


def choose_precision(cfg, model: nn.Module, task, device: torch.device, world_size: int, log) -> torch.dtype | None:
    """The autocast dtype training runs in (None: fp32): ``cfg.precision`` resolved, ``auto``
    on a CPU with native bf16 by measurement (see the module's docstring), told to ``log``."""
    by_flags = resolve_precision(cfg.precision, device)
    if cfg.precision != "auto" or device.type != "cpu" or world_size > 1 or not hardware.cpu_has_native_bf16():
        return by_flags
    batch = typical_batch(task, model)
    with warnings.catch_warnings(record=True) as caught:  # one line in the log, not Python's two on stderr
        warnings.simplefilter("always", choose.MeasureWarning)
        times = choose.kept_times([recipe_key(model, batch, cfg)], PRECISIONS, "training's precision",
                                  lambda _: time_updates(model, batch, cfg))
    for w in caught:
        log(f"warning: {w.message}")
    if times is None:
        return by_flags
    seconds = next(iter(times.values()))
    chosen = min(PRECISIONS, key=seconds.get)
    tokens = batch_tokens(batch)
    rates = " and ".join(f"{p} {tokens / seconds[p]:,.0f}" for p in PRECISIONS)
    log(f"precision auto: {chosen} (measured on this CPU, one thread: {rates} tokens/s an update; "
        "kept in the cache for the next run)")
    return torch.bfloat16 if chosen == "bf16" else None


def typical_batch(task, model: nn.Module):
    """A micro-batch of the recipe's shape, made without touching its sampler: a language
    model's ``batch_size`` windows of its context from the stream's start; a translation's
    pairs of the median length, as many as fill ``max_tokens``."""
    c = model.cfg
    if hasattr(task, "context"):
        n = max(1, min(task.cfg.batch_size, (len(task.data.train) - 1) // task.context))
        return windows(task.data.train, torch.arange(n) * task.context, min(task.context, len(task.data.train) - 1))
    train = task.data.train
    order = sorted(range(len(train)), key=lambda i: max(len(train[i][0]), len(train[i][1])))
    median = max(len(train[order[len(order) // 2]][0]), len(train[order[len(order) // 2]][1])) + 2
    n = max(1, min(len(order), task.cfg.max_tokens // median))
    first = max(0, min(len(order) // 2 - n // 2, len(order) - n))
    return collate([train[i] for i in order[first:first + n]], c.pad_id, c.bos_id, c.eos_id)


def batch_tokens(batch) -> int:
    return int(batch.n_tgt_tokens) if hasattr(batch, "n_tgt_tokens") else batch.y.numel()


def recipe_key(model: nn.Module, batch, cfg) -> str:
    """The cache entry of a recipe: what an update's time depends on (the model's shape, the
    batch's, the optimizer), hashed."""
    shapes = [list(t.shape) for t in batch.inputs]
    what = {"model": dataclasses.asdict(model.cfg), "batch": shapes, "optimizer": cfg.optimizer, "updates": UPDATES}
    return "train-" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def time_updates(model: nn.Module, batch, cfg) -> dict[str, float]:
    """Seconds of one update (forward, backward, optimizer step) of copies of ``model`` on
    ``batch`` in each of :data:`PRECISIONS`: the fastest of :data:`UPDATES`, taking turns after
    a warm-up each, on one thread in CPU time (:func:`transformer.decode.choose._seconds`'s
    reasons). The global random state is restored afterwards (dropout draws from it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            runs = {}
            for name in PRECISIONS:
                copied = copy.deepcopy(model).train()
                runs[name] = (copied, make_optimizer(copied, cfg.optimizer, cfg.weight_decay, cfg.betas),
                              torch.bfloat16 if name == "bf16" else None)
            best = dict.fromkeys(PRECISIONS, math.inf)
            for r in range(UPDATES + 1):  # round 0 warms up (oneDNN picks its kernels, Adam makes its state)
                for name in PRECISIONS[r % 2:] + PRECISIONS[:r % 2]:
                    seconds = _update_seconds(*runs[name], batch, cfg)
                    if r:
                        best[name] = min(best[name], seconds)
            return best
    finally:
        torch.set_num_threads(threads)


def _update_seconds(model, optimizer, amp_dtype, batch, cfg) -> float:
    start = time.thread_time()
    train_step(model, [batch], optimizer, 1e-4, epsilon=cfg.label_smoothing, amp_dtype=amp_dtype)
    return time.thread_time() - start
