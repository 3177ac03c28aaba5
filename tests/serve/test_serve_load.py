"""A bounded load test of the real server: 16 clients for about 2 seconds. Every answer
must be right, the dynamic batcher must have merged requests (fewer decode calls than
requests), and throughput and latency percentiles are reported (run with -s to see them;
they are also written to load-report.json in the test's tmp dir). The same for /generate on
a language-model server: a fixed number of requests, half of them streamed, each complete
and the text its seed gives alone."""
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


# ---- /generate ---------------------------------------------------------------------------

GEN_CLIENTS = 8
GEN_REQUESTS = 3  # per client
GEN_TOKENS = 24
PROMPTS = ["the cat", "a dog ran", "then", "the log", "slowly the mat", "and"]


async def generate_load(url: str) -> dict:
    """Every client sends GEN_REQUESTS requests one after another, odd clients streaming;
    returns each answer's (prompt, seed, text, tokens, events) and every failure."""
    answers: list[tuple[str, int, str, int, int]] = []
    failed: list[str] = []

    async def client(c: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            for r in range(GEN_REQUESTS):
                seed = c * GEN_REQUESTS + r
                prompt = PROMPTS[seed % len(PROMPTS)]
                body = {"prompt": prompt, "seed": seed, "max_new_tokens": GEN_TOKENS}
                if c % 2:
                    async with http.stream("POST", "/generate", json=body,
                                           headers={"Accept": "text/event-stream"}) as resp:
                        raw = "".join([chunk async for chunk in resp.aiter_text()])
                    blocks = [b for b in raw.split("\n\n") if b.strip()]
                    if resp.status_code != 200 or not blocks or not blocks[-1].startswith("event: done\n"):
                        failed.append(f"{resp.status_code} {raw[-200:]}")
                        continue
                    done = json.loads(blocks[-1].split("data: ", 1)[1])
                    answers.append((prompt, seed, done["text"], done["tokens"], len(blocks) - 1))
                else:
                    resp = await http.post("/generate", json=body)
                    if resp.status_code != 200:
                        failed.append(f"{resp.status_code} {resp.text[:200]}")
                        continue
                    answers.append((prompt, seed, resp.json()["text"], resp.json()["tokens"], GEN_TOKENS))

    await asyncio.gather(*(client(c) for c in range(GEN_CLIENTS)))
    return {"answers": answers, "failed": failed}


def test_concurrent_generate_requests_all_complete_with_their_seeds_text(lm_server, lm_run, tmp_path):
    from transformer.generator import Generator

    before = lm_server.get("/stats")[1]
    result = asyncio.run(generate_load(lm_server.url))
    after = lm_server.get("/stats")[1]
    requests = after["requests"] - before["requests"]
    decode_calls = after["decode_calls"] - before["decode_calls"]
    report = {"clients": GEN_CLIENTS, "requests": requests, "decode_calls": decode_calls,
              "largest_batch": after["largest_batch"]}
    (tmp_path / "generate-load-report.json").write_text(json.dumps(report, indent=2))
    print("\ngenerate load:", json.dumps(report))

    assert not result["failed"], result["failed"][:5]
    assert len(result["answers"]) == requests == GEN_CLIENTS * GEN_REQUESTS
    generator = Generator.from_pretrained(lm_run, warn=False, max_new_tokens=GEN_TOKENS)
    for prompt, seed, text, tokens, events in result["answers"]:
        assert tokens == events == GEN_TOKENS  # streamed: one event per token, then done
        generator.decoding = generator.decoding.replace(seed=seed)
        assert text == generator.generate([prompt])[0], (prompt, seed)
    assert decode_calls < requests, "concurrent requests were not batched"
