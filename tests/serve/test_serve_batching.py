"""The dynamic batcher on its own, with a stand-in decode function (no model, no server)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from transformer.serve.batching import DynamicBatcher


class Recorder:
    """A decode function that records its calls and answers ``f"{key}:{text}"``."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None) -> None:
        self.calls: list[tuple[object, list[str]]] = []
        self.threads: set[str] = set()
        self.delay, self.fail_on = delay, fail_on
        self.active = 0
        self.max_active = 0

    def __call__(self, key, texts):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.threads.add(threading.current_thread().name)
        self.calls.append((key, list(texts)))
        time.sleep(self.delay)
        self.active -= 1
        if self.fail_on in texts:
            raise RuntimeError("decode failed")
        return [f"{key}:{t}" for t in texts]


def run(coro):
    return asyncio.run(coro)


async def with_batcher(decode, fn, **kwargs):
    batcher = DynamicBatcher(decode, **kwargs)
    await batcher.start()
    try:
        return await fn(batcher), batcher
    finally:
        await batcher.stop()


def test_concurrent_requests_share_one_decode_call_and_keep_their_order():
    decode = Recorder()

    async def go(b):
        return await asyncio.gather(*(b.submit("k", [f"t{i}a", f"t{i}b"]) for i in range(5)))

    results, batcher = run(with_batcher(decode, go, max_batch=32, max_wait_s=0.05))
    assert results == [[f"k:t{i}a", f"k:t{i}b"] for i in range(5)]
    assert len(decode.calls) == 1 and len(decode.calls[0][1]) == 10
    stats = batcher.stats.as_dict()
    assert stats.pop("decode_seconds") >= 0
    assert stats == {"requests": 5, "texts": 10, "decode_calls": 1, "largest_batch": 10, "exclusive_calls": 0,
                     "refused": 0, "abandoned": 0}


def test_different_keys_are_decoded_apart():
    decode = Recorder()

    async def go(b):
        return await asyncio.gather(b.submit(1, ["a"]), b.submit(4, ["b"]), b.submit(1, ["c"]), b.submit(4, ["d"]))

    results, _ = run(with_batcher(decode, go, max_batch=32, max_wait_s=0.05))
    assert results == [["1:a"], ["4:b"], ["1:c"], ["4:d"]]
    assert sorted(decode.calls) == [(1, ["a", "c"]), (4, ["b", "d"])]


def test_batches_never_exceed_max_batch_and_a_big_request_is_not_split():
    decode = Recorder()

    async def go(b):
        return await asyncio.gather(*(b.submit("k", [str(i)] * n) for i, n in enumerate([2, 2, 2, 5, 1])))

    results, _ = run(with_batcher(decode, go, max_batch=4, max_wait_s=0.05))
    assert [len(r) for r in results] == [2, 2, 2, 5, 1]
    assert [len(texts) for _, texts in decode.calls] == [4, 2, 5, 1]  # the 5 goes alone, order kept


def test_no_batching_decodes_each_request_alone():
    decode = Recorder()

    async def go(b):
        return await asyncio.gather(*(b.submit("k", [str(i)]) for i in range(6)))

    results, batcher = run(with_batcher(decode, go, max_batch=32, max_wait_s=0.05, batching=False))
    assert results == [[f"k:{i}"] for i in range(6)]
    assert batcher.stats.decode_calls == 6 == len(decode.calls)


def test_decoding_runs_in_one_thread_off_the_event_loop():
    decode = Recorder(delay=0.05)
    ticks = []

    async def go(b):
        async def ticker():  # keeps running while the decode thread sleeps
            for _ in range(5):
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        jobs = [b.submit(k, [str(i)]) for i, k in enumerate("abab")]
        jobs.append(b.run_exclusive(decode, "x", ["exclusive"]))
        return await asyncio.gather(ticker(), *jobs)

    _, batcher = run(with_batcher(decode, go, max_batch=32, max_wait_s=0.0))
    assert len(ticks) == 5
    assert decode.max_active == 1, "decode ran concurrently with itself"
    assert len(decode.threads) == 1 and next(iter(decode.threads)).startswith("decode")
    assert batcher.stats.exclusive_calls == 1


def test_a_failing_decode_fails_only_its_batch():
    decode = Recorder(fail_on="bad")

    async def go(b):
        bad = await asyncio.gather(b.submit(1, ["bad"]), b.submit(1, ["fine"]), return_exceptions=True)
        good = await b.submit(1, ["later"])
        return bad, good

    (bad, good), _ = run(with_batcher(decode, go, max_batch=32, max_wait_s=0.05))
    assert all(isinstance(r, RuntimeError) for r in bad)  # they shared the failed call
    assert good == ["1:later"]


def test_a_lone_request_waits_at_most_max_wait():
    decode = Recorder()

    async def go(b):
        start = time.perf_counter()
        await b.submit("k", ["alone"])
        return time.perf_counter() - start

    elapsed, _ = run(with_batcher(decode, go, max_batch=32, max_wait_s=0.02))
    assert 0.015 <= elapsed < 1.0


def test_empty_requests_and_submit_before_start():
    decode = Recorder()

    async def go(b):
        return await b.submit("k", [])

    assert run(with_batcher(decode, go))[0] == []
    assert decode.calls == []
    with pytest.raises(RuntimeError, match="start"):
        run(DynamicBatcher(decode).submit("k", ["a"]))
