"""Admission control: the service says no instead of drowning. A full queue answers 503 with
Retry-After, a request past its deadline 504, a request whose client left is never decoded,
and listening beyond loopback without a token prints a warning (what a token guards:
test_serve_token.py).

The in-process tests hold the decoding thread on a gate (the real decode behind it), so
"the model is busy" is a fact of the test, not a race with a fast toy model."""
from __future__ import annotations

import asyncio
import importlib
import json
import threading
import time
from contextlib import asynccontextmanager

import httpx
import pytest

from transformer.serve import ServeConfig, create_app
from transformer.serve.serve_config import TOKEN_ENV

S = ["the dog runs", "a small cat sits near the tree", "red ball", "green bird"]


class Gate:
    """Stands in for the batcher's decode: records the texts it is given, waits until
    ``open`` is set, then decodes them for real."""

    def __init__(self, decode) -> None:
        self.decode, self.seen = decode, []
        self.open, self.entered = threading.Event(), threading.Event()

    def __call__(self, key, texts):
        self.seen += texts
        self.entered.set()
        self.open.wait(30)
        return self.decode(key, texts)


@asynccontextmanager
async def serving(translator, gated: bool = True, **settings):
    """(app, client, gate) of the translation app in-process, its batcher running."""
    app = create_app(translator, ServeConfig(**settings))
    batcher = app.state.service.batcher
    gate = batcher.decode = Gate(batcher.decode)
    if not gated:
        gate.open.set()
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
            try:
                yield app, http, gate
            finally:
                gate.open.set()  # else stopping the batcher would wait for the thread


async def until(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        await asyncio.sleep(0.005)


def translate(http, text: str, **headers):
    return asyncio.ensure_future(http.post("/translate", json={"text": text}, headers=headers))


def test_a_full_queue_answers_503_with_retry_after_and_the_queued_still_get_theirs(translator):
    async def go():
        async with serving(translator, max_queue=1, max_batch=1, max_wait_ms=0) as (app, http, gate):
            first = translate(http, S[0])
            await until(gate.entered.is_set)  # the model is busy with it
            second = translate(http, S[1])
            await until(lambda: app.state.service.batcher.waiting == 1)  # and the queue is full
            third = await http.post("/translate", json={"text": S[2]})
            gate.open.set()
            return third, await first, await second, (await http.get("/stats")).json()

    refused, first, second, stats = asyncio.run(go())
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert "busy" in refused.json()["error"]
    assert [first.status_code, second.status_code] == [200, 200]
    assert [first.json()["translation"], second.json()["translation"]] == translator.translate(S[:2])
    assert stats["refused"] == 1 and stats["requests"] == 2 and stats["waiting"] == 0


def test_past_the_deadline_504_and_a_queued_request_is_dropped_undecoded(translator):
    async def go():
        async with serving(translator, timeout=0.3, max_batch=1, max_wait_ms=0) as (app, http, gate):
            start = time.perf_counter()
            first = translate(http, S[0])
            await until(gate.entered.is_set)
            second = translate(http, S[1])
            answers = await asyncio.gather(first, second)
            elapsed = time.perf_counter() - start
            gate.open.set()
            later = await http.post("/translate", json={"text": S[2]})  # the server still serves
            return answers, elapsed, later, gate.seen, (await http.get("/stats")).json()

    (first, second), elapsed, later, seen, stats = asyncio.run(go())
    assert [first.status_code, second.status_code] == [504, 504]
    assert "0.3 s" in first.json()["error"]
    assert elapsed < 5
    assert S[1] not in seen  # the one waiting in the queue never reached the model
    assert stats["abandoned"] == 1 and stats["waiting"] == 0
    assert later.status_code == 200 and later.json()["translation"] == translator.translate([S[2]])[0]


def test_a_translation_whose_client_left_is_not_decoded(translator):
    """The client of the second request hangs up while it waits: its handler is cancelled and
    it leaves the queue (Starlette alone would have let it be decoded for nobody)."""
    body = json.dumps({"text": S[1]}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/translate", "raw_path": b"/translate",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def go():
        async with serving(translator, max_batch=1, max_wait_ms=0) as (app, http, gate):
            batcher = app.state.service.batcher
            first = translate(http, S[0])
            await until(gate.entered.is_set)
            hangup, sent = asyncio.Event(), []
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive():
                if messages:
                    return messages.pop(0)
                await hangup.wait()
                return {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            left = asyncio.ensure_future(app(scope, receive, send))
            await until(lambda: batcher.waiting == 1)
            hangup.set()
            await asyncio.wait_for(left, 5)
            waiting_after = batcher.waiting
            gate.open.set()
            first = await first
            await http.post("/translate", json={"text": S[2]})
            return first, sent, waiting_after, gate.seen, batcher.stats

    first, sent, waiting_after, seen, stats = asyncio.run(go())
    assert first.status_code == 200
    assert sent == []  # nobody to answer
    assert waiting_after == 0 and stats.abandoned == 1
    assert seen == [S[0], S[2]]  # S[1] was never decoded


def test_language_model_attention_refuses_text_over_max_chars(lm_client):
    r = lm_client.post("/attention", json={"text": "a" * 201})
    assert r.status_code == 413
    assert "201 characters" in r.json()["error"] and "200" in r.json()["error"]
    assert lm_client.post("/attention", json={"text": "a" * 200}).status_code == 200


def test_a_full_queue_refuses_a_stream_before_it_starts(lm_run):
    """A streamed /generate that cannot be queued is a 503, not a 200 whose stream errs."""
    from transformer.inference.generator import Generator

    app = create_app(Generator.from_pretrained(lm_run, warn=False), ServeConfig(max_queue=1))

    async def go():
        async with app.router.lifespan_context(app):
            app.state.service.batcher._exclusive = 1  # as if an attention call were waiting: the queue is full
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
                try:
                    return await http.post("/generate", json={"prompt": "the cat", "stream": True})
                finally:
                    app.state.service.batcher._exclusive = 0

    r = asyncio.run(go())
    assert r.status_code == 503 and "Retry-After" in r.headers


# ---- the command: a token wherever anyone may connect ----------------------------------

class FakeSocket:
    """What ``_listen`` returns, without opening anything: the tests never listen beyond loopback."""

    def __init__(self, host: str) -> None:
        self.host = host

    def getsockname(self):
        return (self.host, 8000)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("host, token, env, made", [
    ("0.0.0.0", None, None, True),
    ("::", None, None, True),
    ("0.0.0.0", "s3cret", None, False),
    ("0.0.0.0", None, "from-env", False),
    ("127.0.0.1", None, None, False),
], ids=["any-v4", "any-v6", "token", "token-from-env", "loopback"])
def test_beyond_loopback_a_token_is_made_when_none_is_given(run_dir, monkeypatch, capsys, host, token, env, made):
    """``serve --host 0.0.0.0`` without a token only warned, and answered anyone. It now makes
    a token and prints it in the page's address (as Jupyter does); the API wants it, and the
    Host check still refuses names it was not given (an IP address passes: a page that
    reaches the server through DNS rebinding names its own domain)."""
    import uvicorn
    from starlette.testclient import TestClient

    from transformer.cli import main
    from transformer.serve.connections import HeaderDeadline

    serve_cli = importlib.import_module("transformer.cli.serve")
    seen = {}

    def run(server, sockets=None):  # instead of serving: what uvicorn was given
        seen["config"] = server.config

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setattr(serve_cli, "_listen", lambda h, p: FakeSocket(host))
    if env is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, env)
    assert main(["serve", "--model", str(run_dir), "--host", host, "--max-queue", "7",
                 *(["--token", token] if token else [])]) == 0
    line = [line for line in capsys.readouterr().err.splitlines() if line.startswith("transformer serve:")]
    assert len(line) == 1, line
    config = seen["config"]
    assert config.limit_concurrency == ServeConfig(max_queue=7).connection_limit
    assert config.timeout_keep_alive == 5
    assert issubclass(config.http, HeaderDeadline) and config.http.header_timeout == ServeConfig.header_timeout
    given = config.app.state.service.cfg.token
    if not made:
        assert given == (token or env) and "a token made" not in line[0]
        return
    assert given is not None and len(given) >= 32 and given not in ("s3cret", "from-env")
    assert line[0].split()[2].endswith(f":8000/#token={given}")  # printed whole: nobody knows it otherwise
    assert f"a token made for this run, as {host} is not a loopback address" in line[0]
    with TestClient(config.app, base_url="http://192.168.1.5:8000") as http:
        assert http.post("/translate", json={"text": S[0]}).status_code == 401
        bearer = {"Authorization": f"Bearer {given}"}
        assert http.post("/translate", json={"text": S[0]}, headers=bearer).status_code == 200
        assert http.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
        r = http.post("/translate", json={"text": S[0]}, headers={**bearer, "Host": "rebound.example"})
        assert r.status_code == 403
        assert "or an IP address); start it with --allow-host rebound.example" in r.json()["error"]


# ---- the real server: a client that hangs up ---------------------------------------------

def test_the_real_server_drops_a_request_whose_client_hung_up(start_another):
    """uvicorn tells the app of a closed connection: the request waiting behind heavy ones
    leaves the queue (abandoned) and the model never decodes it."""
    import socket
    from urllib.parse import urlsplit

    server = start_another("--max-batch", "1", "--max-texts", "64", "--max-work", "1000000")
    heavy = {"texts": [" ".join(["the big red dog runs near the house"] * 12)] * 64, "beam": 16}
    body = json.dumps({"text": "green bird"}).encode()
    before = server.get("/stats")[1]

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            async def stats():
                return (await http.get("/stats")).json()

            async def until_stats(condition):
                end = time.monotonic() + 30
                while not condition(await stats()):
                    assert time.monotonic() < end, await stats()
                    await asyncio.sleep(0.005)

            heavies = asyncio.gather(*(http.post("/translate", json=heavy) for _ in range(4)))
            await until_stats(lambda s: s["waiting"] >= 2)  # one decoding, more waiting
            parts = urlsplit(server.url)
            sock = socket.create_connection((parts.hostname, parts.port))
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await until_stats(lambda s: s["requests"] - before["requests"] == 5)  # it is queued
            sock.close()
            await until_stats(lambda s: s["abandoned"] - before["abandoned"] == 1)
            return [r.status_code for r in await heavies]

    assert asyncio.run(go()) == [200] * 4
    after = server.get("/stats")[1]
    assert after["decode_calls"] - before["decode_calls"] == 4  # the heavy ones only
    assert after["waiting"] == 0


def test_a_body_that_does_not_arrive_in_time_gets_408(translator):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/translate", "raw_path": b"/translate", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 80)}

    async def go():
        app = create_app(translator, ServeConfig(timeout=0.2))
        sent = []

        async def receive():  # a client that sent its headers and then nothing
            await asyncio.sleep(30)

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(app(scope, receive, send), 5)
        return sent

    sent = asyncio.run(go())
    assert sent[0]["status"] == 408
    assert "0.2 s" in json.loads(sent[1]["body"])["error"]


def test_only_the_servers_own_beam_may_build_a_compiled_step(translator):
    """With compile: on, a request for another beam must not build a package (minutes) in a
    request: it uses one built already, or decodes eagerly."""
    service = create_app(translator.with_decoding(compile="on"), ServeConfig()).state.service
    own = translator.decoding.beam
    assert service.translator(own).decoding.compile == "on"  # built at start-up by `transformer serve`
    assert service.translator(own + 1).decoding.compile == "auto"
    assert service.translator(1).decoding.compile == "auto"


def test_streams_arriving_together_at_a_full_queue_get_503_not_an_error_event(lm_run):
    """Streams were admitted when their handler ran but queued only when their stream began:
    several arriving together all passed, and those the queue then had no room for got a
    200 whose stream said "internal error: QueueFull". A stream is queued before its answer
    starts, so each one gets its tokens or a 503."""
    from transformer.inference.generator import Generator

    app = create_app(Generator.from_pretrained(lm_run, warn=False), ServeConfig(max_queue=1, max_batch=1))
    batcher = app.state.service.batcher
    gate = batcher.decode = Gate(batcher.decode)
    body = {"prompt": "the cat", "max_new_tokens": 5, "seed": 1, "stream": True}

    async def go():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
                try:
                    busy = asyncio.ensure_future(http.post("/generate", json={**body, "stream": False}))
                    await until(gate.entered.is_set)  # the model is busy with it; the queue is empty
                    streams = [asyncio.ensure_future(http.post("/generate", json=body)) for _ in range(6)]
                    await asyncio.wait(streams, timeout=20, return_when=asyncio.FIRST_COMPLETED)
                    gate.open.set()
                    return await busy, await asyncio.gather(*streams)
                finally:
                    gate.open.set()

    busy, streams = asyncio.run(go())
    assert busy.status_code == 200
    statuses = sorted(r.status_code for r in streams)
    assert statuses == [200] + [503] * 5, [r.text[-200:] for r in streams]
    for r in streams:
        if r.status_code == 200:
            assert "event: done" in r.text and "event: error" not in r.text
        else:
            assert "busy" in r.json()["error"] and "Retry-After" in r.headers


def test_a_stream_still_queued_at_its_deadline_gets_504_and_is_never_decoded(lm_run):
    """Streams got their 200 when they were queued, so --timeout never applied to them: five
    1,024-token streams with --timeout 3 all got a 200, the last its first token 16 s later. A
    stream's answer now starts with its first token: one still queued at the deadline gets
    the 504 a request for JSON gets, leaves the queue and is never decoded."""
    from transformer.inference.generator import Generator

    app = create_app(Generator.from_pretrained(lm_run, warn=False), ServeConfig(timeout=2, max_batch=1,
                                                                                  max_wait_ms=0))
    batcher = app.state.service.batcher
    gate = batcher.decode = Gate(batcher.decode)
    body = {"prompt": "the cat", "max_new_tokens": 5, "seed": 1, "stream": True}

    async def go():
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
                try:
                    busy = asyncio.ensure_future(http.post("/generate", json={**body, "stream": False}))
                    await until(gate.entered.is_set)  # the model is busy with it
                    streams = [asyncio.ensure_future(http.post("/generate", json=body)) for _ in range(3)]
                    done, _ = await asyncio.wait(streams, timeout=10)  # answered while the model is still busy
                    gate.open.set()
                    answers = await asyncio.gather(*streams)
                    await busy
                    later = await http.post("/generate", json=body)  # one that starts in time streams whole
                    return len(done), answers, later, list(gate.seen), (await http.get("/stats")).json()
                finally:
                    gate.open.set()

    done, answers, later, seen, stats = asyncio.run(go())
    assert done == 3, "the queued streams were not answered before the model was free"
    for r in answers:
        assert r.status_code == 504 and "no answer within 2 s" in r.json()["error"], r.text[-200:]
    assert len(seen) == 2  # the busy request's row and the later stream's: the three never reached the model
    assert stats["abandoned"] == 3 and stats["waiting"] == 0
    assert later.status_code == 200 and later.text.rstrip().splitlines()[-2] == "event: done"
