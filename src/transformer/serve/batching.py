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

Admission: at most ``max_queue`` requests wait for the model; one more is refused at once
with :class:`QueueFull` (the app answers 503 with ``Retry-After``), so a burst costs callers
a quick "no" instead of an ever longer wait. A request whose handler is cancelled (its client
went away, or its deadline passed: see :mod:`.guard`) leaves the queue at once and is never
decoded; one already in a decode call finishes there and its result is dropped.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
Decode = Callable[[Hashable, list[str]], Sequence[Any]]  # (key, texts) -> one result per text


@dataclass(eq=False)  # compared by identity: the queue removes a cancelled job by it
class _Job:
    key: Hashable
    texts: list[str]
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


class QueueFull(Exception):
    """The batcher holds ``max_queue`` waiting requests already; try again in ``retry_after``
    seconds (an estimate: the time to decode what is waiting)."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the server is busy ({waiting} requests waiting); try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass
class BatchStats:
    """Counters since start-up (read them at ``/stats``)."""

    requests: int = 0  # submit() calls
    texts: int = 0  # texts in them
    decode_calls: int = 0  # decode() calls: fewer than requests when batching works
    largest_batch: int = 0  # the most texts in one decode() call
    exclusive_calls: int = 0  # run_exclusive() calls (attention)
    decode_seconds: float = 0.0  # wall time spent in decode(): how busy the model is
    refused: int = 0  # requests turned away because max_queue were waiting (503)
    abandoned: int = 0  # requests dropped before decoding: their handler was cancelled

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
        max_queue: the most requests waiting for the model (submitted and not yet in a
            decode call, or attention calls not yet finished); :meth:`submit` and
            :meth:`run_exclusive` raise :class:`QueueFull` beyond it.

    Use it inside a running event loop: ``await start()`` first and ``await stop()`` last.
    """

    def __init__(self, decode: Decode, max_batch: int = 32, max_wait_s: float = 0.005,
                 batching: bool = True, max_queue: int = 1 << 30) -> None:
        self.decode = decode
        self.max_batch = max_batch if batching else 1
        self.max_wait_s = max_wait_s if batching else 0.0
        self.max_queue = max_queue
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()  # submitted, not yet taken by the worker
        self._arrived: asyncio.Event | None = None  # set when _pending gains a job
        self._exclusive = 0  # run_exclusive() calls not yet finished
        self._held: _Job | None = None  # taken from the queue but too big for the last batch
        self._worker: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")

    async def start(self) -> None:
        self._arrived = asyncio.Event()
        self._worker = asyncio.create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._thread.shutdown(wait=True, cancel_futures=True)

    @property
    def waiting(self) -> int:
        """Requests waiting for the model (what ``max_queue`` bounds)."""
        return len(self._pending) + self._exclusive

    async def submit(self, key: Hashable, texts: list[str]) -> list[Any]:
        """Queue ``texts`` for decoding with ``key`` and wait for their results, in order.
        Raises :class:`QueueFull` when ``max_queue`` requests are waiting already."""
        job = self._enqueue(key, texts)
        if job is None:
            return []
        try:
            return await job.future
        except asyncio.CancelledError:
            self._withdraw(job)  # still waiting: it leaves the queue, never decoded
            raise

    def enqueue(self, key: Hashable, texts: list[str]) -> asyncio.Future:
        """:meth:`submit`, queued at once (a full queue raises :class:`QueueFull` here, not when
        the results are awaited): the future of the results. Cancelled before its decode call,
        it is never decoded."""
        job = self._enqueue(key, texts)
        if job is not None:
            job.future.add_done_callback(lambda future: self._withdraw(job) if future.cancelled() else None)
            return job.future
        done = asyncio.get_running_loop().create_future()
        done.set_result([])
        return done

    def _withdraw(self, job: _Job) -> None:
        """A cancelled job still waiting leaves the queue (the worker skips one it took already)."""
        if job in self._pending:
            self._pending.remove(job)
            self.stats.abandoned += 1

    def _enqueue(self, key: Hashable, texts: list[str]) -> _Job | None:
        """Admit and queue a request: its job (None for no texts: nothing to decode)."""
        if self._arrived is None:
            raise RuntimeError("DynamicBatcher.start() was not awaited")
        self.admit()
        self.stats.requests += 1
        self.stats.texts += len(texts)
        if not texts:
            return None
        job = _Job(key, list(texts), asyncio.get_running_loop().create_future())
        self._pending.append(job)
        self._arrived.set()
        return job

    async def run_exclusive(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the decoding thread, between batches (for work that uses
        the model but is not batched, like attention maps). Cancelled before it starts, it
        never runs. Raises :class:`QueueFull` as :meth:`submit` does."""
        self.admit()
        self.stats.exclusive_calls += 1
        self._exclusive += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        finally:
            self._exclusive -= 1

    def admit(self) -> None:
        """Raise :class:`QueueFull` (and count it) when ``max_queue`` requests are waiting."""
        if self.waiting >= self.max_queue:
            self.stats.refused += 1
            raise QueueFull(self.waiting, self.retry_after())

    def retry_after(self) -> int:
        """Whole seconds to decode what is waiting, at the mean decode call's pace (at least 1)."""
        per_call = self.stats.decode_seconds / max(self.stats.decode_calls, 1)
        texts = sum(len(job.texts) for job in self._pending) + self._exclusive
        return max(1, math.ceil(per_call * (texts / self.max_batch + 1)))

    # ---- the worker ---------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            for key, jobs in _group_by_key(batch).items():
                live = [job for job in jobs if not job.future.done()]  # cancelled since it was taken
                self.stats.abandoned += len(jobs) - len(live)
                jobs = live
                if not jobs:
                    continue
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
        first, self._held = self._held or await self._next(None), None
        assert first is not None
        batch, size = [first], len(first.texts)
        deadline = first.queued_at + self.max_wait_s  # time spent queued counts as waiting
        while size < self.max_batch:
            job = await self._next(deadline)  # out of time, it still takes what is waiting
            if job is None:
                break
            if size + len(job.texts) > self.max_batch:
                self._held = job  # first in the next batch
                break
            batch.append(job)
            size += len(job.texts)
        return batch

    async def _next(self, deadline: float | None) -> _Job | None:
        """The oldest waiting job, waiting for one until ``deadline`` (perf_counter seconds;
        None: for ever); None when none came."""
        assert self._arrived is not None
        while not self._pending:
            self._arrived.clear()
            remaining = None if deadline is None else deadline - time.perf_counter()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return None
        return self._pending.popleft()


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
