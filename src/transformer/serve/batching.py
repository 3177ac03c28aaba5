"""Dynamic batching: requests that arrive together are decoded together.

Handlers ``await batcher.submit(key, texts)``. One worker task takes the first waiting
request, then keeps collecting until the batch holds ``max_batch`` texts or ``max_wait_s``
has passed, splits what it collected by ``key`` (requests with different beam sizes cannot
share a beam search), and runs one ``decode(key, texts)`` call per key in a single
dedicated thread. So the event loop never blocks on the model, torch is never called from
two threads at once, and while one batch decodes the next one fills up by itself.

The "texts" are whatever ``decode`` takes, one result each: sentences for translation,
prompt rows (:class:`~.generation.Row`) for a language model, whose key is the sampling
settings a batch shares.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
Decode = Callable[[Hashable, list[str]], Sequence[Any]]  # (key, texts) -> one result per text


@dataclass
class _Job:
    key: Hashable
    texts: list[str]
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """Counters since start-up (read them at ``/stats``)."""

    requests: int = 0  # submit() calls
    texts: int = 0  # texts in them
    decode_calls: int = 0  # decode() calls: fewer than requests when batching works
    largest_batch: int = 0  # the most texts in one decode() call
    exclusive_calls: int = 0  # run_exclusive() calls (attention)
    decode_seconds: float = 0.0  # wall time spent in decode(): how busy the model is

    def as_dict(self) -> dict[str, int | float]:
        return {**self.__dict__, "decode_seconds": round(self.decode_seconds, 3)}


class DynamicBatcher:
    """Collects concurrent :meth:`submit` calls into batched ``decode`` calls.

    Args:
        decode: ``decode(key, texts)`` -> one result per text, in order. Runs in the
            batcher's one worker thread, never concurrently with itself.
        max_batch: stop collecting once a batch holds this many texts. A request is never
            split, so one with more texts than this is decoded alone.
        max_wait_s: how long a batch's first request waits for others, in seconds.
        batching: False decodes each request alone, first come first served.

    Use it inside a running event loop: ``await start()`` first and ``await stop()`` last.
    """

    def __init__(self, decode: Decode, max_batch: int = 32, max_wait_s: float = 0.005,
                 batching: bool = True) -> None:
        self.decode = decode
        self.max_batch = max_batch if batching else 1
        self.max_wait_s = max_wait_s if batching else 0.0
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._held: _Job | None = None  # taken from the queue but too big for the last batch
        self._worker: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._thread.shutdown(wait=True, cancel_futures=True)

    async def submit(self, key: Hashable, texts: list[str]) -> list[Any]:
        """Queue ``texts`` for decoding with ``key`` and wait for their results, in order."""
        if self._queue is None:
            raise RuntimeError("DynamicBatcher.start() was not awaited")
        self.stats.requests += 1
        self.stats.texts += len(texts)
        if not texts:
            return []
        job = _Job(key, list(texts), asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        return await job.future

    async def run_exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the decoding thread, between batches (for work that uses
        the model but is not batched, like attention maps)."""
        self.stats.exclusive_calls += 1
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    # ---- the worker ---------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            for key, jobs in _group_by_key(batch).items():
                texts = [t for job in jobs for t in job.texts]
                self.stats.decode_calls += 1
                self.stats.largest_batch = max(self.stats.largest_batch, len(texts))
                start = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self._thread, self.decode, key, texts)
                except Exception as e:  # a bug in decode: fail these requests, keep serving
                    for job in jobs:
                        _settle(job, exception=e)
                    continue
                finally:
                    self.stats.decode_seconds += time.perf_counter() - start
                start = 0
                for job in jobs:
                    _settle(job, result=list(results[start:start + len(job.texts)]))
                    start += len(job.texts)

    async def _collect(self) -> list[_Job]:
        """The next batch: the first job, then whatever arrives within ``max_wait_s``
        while the batch has room."""
        assert self._queue is not None
        first, self._held = self._held or await self._queue.get(), None
        batch, size = [first], len(first.texts)
        deadline = first.queued_at + self.max_wait_s  # time spent queued counts as waiting
        while size < self.max_batch:
            remaining = deadline - time.perf_counter()
            try:
                if remaining > 0:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                else:  # out of time, but take what is already waiting
                    job = self._queue.get_nowait()
            except (TimeoutError, asyncio.QueueEmpty):
                break
            if size + len(job.texts) > self.max_batch:
                self._held = job  # first in the next batch
                break
            batch.append(job)
            size += len(job.texts)
        return batch


def _group_by_key(jobs: list[_Job]) -> dict[Hashable, list[_Job]]:
    groups: dict[Hashable, list[_Job]] = {}
    for job in jobs:
        groups.setdefault(job.key, []).append(job)
    return groups


def _settle(job: _Job, result: Any = None, exception: BaseException | None = None) -> None:
    if job.future.done():  # the client went away and its handler was cancelled
        return
    if exception is not None:
        job.future.set_exception(exception)
    else:
        job.future.set_result(result)
