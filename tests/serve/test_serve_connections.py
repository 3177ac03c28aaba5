"""Connections that never finish a request cannot lock the service. A connection has
--header-timeout seconds from its opening (or its last answer) to send a request's headers,
however slowly they trickle in; connections waiting for their headers do not count against
uvicorn's connection limit; and one client address holds at most ``idle_per_client`` of them
(one more closes its oldest). Real sockets on 127.0.0.1 only, bounded counts and waits.

Before, 230 idle connections to a server with the default limit (224) got every other
request uvicorn's 503, /health too, for as long as they were held."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from urllib.parse import urlsplit

import uvicorn

from transformer.serve import ServeConfig
from transformer.serve.connections import protocol

WAIT = 30.0  # the most a test waits for the server to close a connection (far above any deadline here)


def open_idle(host: str, port: int, n: int, first_line: bool = False) -> list[socket.socket]:
    """``n`` connections that send nothing, or (``first_line``) a request line and one header
    of a request they never finish."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection((host, port), timeout=WAIT)
        if first_line:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(sock)
    return socks


def status(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET, or a POST of JSON ``data``: uvicorn's own 503 is not JSON."""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def is_open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open (nothing to read, no end of stream)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:  # reset
        return False
    finally:
        sock.setblocking(True)


def until_closed(sock: socket.socket, trickle: bool = False) -> None:
    """Wait (at most WAIT seconds) for the server to close ``sock``; ``trickle``: sending one
    more header line every 0.2 s meanwhile, as a slow client would."""
    end = time.monotonic() + WAIT
    sock.settimeout(0.2)
    while time.monotonic() < end:
        try:
            if trickle:
                sock.sendall(b"X-Slow: 1\r\n")
            if sock.recv(1024) == b"":
                return
        except TimeoutError:
            continue
        except OSError:  # reset, or a broken pipe: closed
            return
    raise AssertionError(f"the server kept an unfinished connection open for over {WAIT} s")


def test_idle_connections_beyond_the_limit_do_not_lock_out_the_real_server(start_another):
    """More idle and half-sent connections than the connection limit (1 + 1 + 64 = 66 here):
    /health and the API still answer 200, and each idle connection is closed at the header
    deadline, the ones trickling header lines too."""
    server = start_another("--max-queue", "1", "--max-batch", "1", "--header-timeout", "5")
    parts = urlsplit(server.url)
    limit = ServeConfig(max_queue=1, max_batch=1).connection_limit
    silent = open_idle(parts.hostname, parts.port, limit)
    slow = open_idle(parts.hostname, parts.port, 10, first_line=True)
    try:
        health = status(server.url + "/health")
        translated = status(server.url + "/translate", b'{"text": "the dog runs"}')
        held = [is_open(s) for s in silent + slow]  # the answers came while they were all held
        assert health[0] == 200 and json.loads(health[1])["status"] == "ok", health  # was uvicorn's 503
        assert translated[0] == 200 and json.loads(translated[1])["translation"], translated
        assert all(held), f"{held.count(False)} idle connections closed before the answers: the test proves nothing"
        for sock in slow:
            until_closed(sock, trickle=True)
        for sock in silent:
            until_closed(sock)
        assert status(server.url + "/health")[0] == 200
    finally:
        for sock in silent + slow:
            sock.close()


# ---- the protocol alone, in front of a small app ----------------------------------------

async def slow_app(scope, receive, send) -> None:
    """Answers "ok" after ``?seconds`` (0 by default)."""
    if scope["type"] != "http":
        return
    query = scope["query_string"].decode()
    await asyncio.sleep(float(query.partition("=")[2] or 0))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def uvicorn_with(cfg: ServeConfig):
    """(host, port) of uvicorn serving ``slow_app`` through ``protocol(cfg)``, in a thread."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(slow_app, http=protocol(cfg), lifespan="off", log_level="warning",
                                           limit_concurrency=cfg.connection_limit))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + WAIT
        while not server.started:
            assert time.monotonic() < end and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield sock.getsockname()[:2]
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


def get(sock: socket.socket, path: str = "/") -> bytes:
    """One keep-alive GET on ``sock``: the answer's status line."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"ok"):
        chunk = sock.recv(1024)
        assert chunk, f"closed before the answer: {answer!r}"
        answer += chunk
    return answer.split(b"\r\n")[0]


def test_one_address_holds_at_most_idle_per_client_waiting_connections():
    """Opening a sixth idle connection with room for four closes the client's two oldest; the
    newest still serve requests."""
    with uvicorn_with(ServeConfig(idle_per_client=4, header_timeout=60)) as (host, port):
        socks = open_idle(host, port, 6)  # one after another: the server accepts them in this order
        try:
            until_closed(socks[0])
            until_closed(socks[1])
            assert [is_open(s) for s in socks[2:]] == [True] * 4
            assert get(socks[5]) == b"HTTP/1.1 200 OK"
        finally:
            for sock in socks:
                sock.close()


def test_a_request_under_way_is_not_cut_by_the_header_deadline():
    """The deadline is for a request's headers: an answer that takes longer than it comes
    whole, and the connection serves another request after it (a fresh deadline)."""
    with uvicorn_with(ServeConfig(header_timeout=0.5)) as (host, port):
        sock = socket.create_connection((host, port), timeout=WAIT)
        try:
            assert get(sock, "/?seconds=1.5") == b"HTTP/1.1 200 OK"
            assert get(sock) == b"HTTP/1.1 200 OK"
            until_closed(sock)  # then idle: closed at its deadline
        finally:
            sock.close()


def test_connections_waiting_for_headers_do_not_count_against_the_limit():
    """With a limit of 66, 80 idle connections and one request: 200, not uvicorn's 503."""
    cfg = ServeConfig(max_queue=1, max_batch=1, header_timeout=60)
    with uvicorn_with(cfg) as (host, port):
        idle = open_idle(host, port, cfg.connection_limit + 14)
        try:
            sock = socket.create_connection((host, port), timeout=WAIT)
            assert get(sock) == b"HTTP/1.1 200 OK"
            sock.close()
            assert all(is_open(s) for s in idle)
        finally:
            for s in idle:
                s.close()
