"""A bounded load test of the real server: 16 clients for about 2 seconds. Every answer
must be right, the dynamic batcher must have merged requests (fewer decode calls than
requests), and throughput and latency percentiles are reported (run with -s to see them;
they are also written to load-report.json in the test's tmp dir)."""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

import httpx

CLIENTS = 16
SECONDS = 2.0


async def load(url: str, texts: list[str], expected: list[str], clients: int, seconds: float) -> dict:
    """``clients`` concurrent clients, each sending one request after another for ``seconds``;
    returns the latencies and every wrong answer."""
    latencies: list[float] = []
    wrong: list[tuple[str, int, str]] = []
    end = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while time.perf_counter() < end:
                i = rng.randrange(len(texts))
                start = time.perf_counter()
                r = await http.post("/translate", json={"text": texts[i]})
                latencies.append(time.perf_counter() - start)
                if r.status_code != 200 or r.json().get("translation") != expected[i]:
                    wrong.append((texts[i], r.status_code, r.text[:200]))

    start = time.perf_counter()
    await asyncio.gather(*(client(seed) for seed in range(clients)))
    return {"latencies": latencies, "wrong": wrong, "elapsed": time.perf_counter() - start}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def test_concurrent_clients_all_get_correct_answers_and_share_decodes(server, translator, sentences, tmp_path):
    expected = translator.translate(sentences)
    before = server.get("/stats")[1]
    result = asyncio.run(load(server.url, sentences, expected, CLIENTS, SECONDS))
    after = server.get("/stats")[1]

    lat = result["latencies"]
    requests = after["requests"] - before["requests"]
    decode_calls = after["decode_calls"] - before["decode_calls"]
    report = {
        "clients": CLIENTS, "requests": len(lat), "seconds": round(result["elapsed"], 2),
        "requests_per_s": round(len(lat) / result["elapsed"], 1),
        "p50_ms": round(1000 * percentile(lat, 50), 1), "p99_ms": round(1000 * percentile(lat, 99), 1),
        "mean_ms": round(1000 * statistics.mean(lat), 1),
        "decode_calls": decode_calls, "texts_per_decode_call": round(requests / max(decode_calls, 1), 2),
        "largest_batch": after["largest_batch"],
    }
    (tmp_path / "load-report.json").write_text(json.dumps(report, indent=2))
    print("\nload:", json.dumps(report))

    assert not result["wrong"], result["wrong"][:5]
    assert len(lat) >= CLIENTS  # every client got at least one answer
    assert requests == len(lat)
    assert decode_calls < requests, "concurrent requests were not batched"
    assert after["largest_batch"] > 1
