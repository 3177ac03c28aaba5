"""What every HTTP request passes before the routes see it: one ASGI middleware, :class:`Guard`.

In order:
  0. the host: with ``ServeConfig.allowed_hosts`` set, a request whose ``Host`` header names
     another host gets 403. A web page elsewhere can reach a server on 127.0.0.1 through
     DNS rebinding (its own name made to resolve to 127.0.0.1), but its requests still carry
     that name. A server on every address (an unspecified one among the names) also answers
     any IP address: a rebound page names its own domain, never an address;
  1. the token: with ``ServeConfig.token`` set, every route wants ``Authorization: Bearer
     TOKEN`` (compared in constant time), 401 without it, but for reading what holds no
     data: ``/health``, and the explorer page with its scripts and styles (a browser opening
     the page cannot send a header; the page's script then sends the token, taken from the
     address's ``#token=`` fragment, on every API call, as Jupyter's pages do);
  2. the body (POST): over ``max_body_bytes`` 413, not UTF-8 400; a client that has not sent
     its body by the deadline gets 408;
  3. the deadline: ``ServeConfig.timeout`` seconds from arrival until the answer starts,
     else 504. The handler is cancelled, which takes a request still in the batcher's queue
     out of it (a decode call already running finishes; its result is dropped);
  4. the client: if it goes away before its answer, the handler is cancelled the same way,
     so nobody decodes for a closed connection (Starlette would let the handler run on).

Refusals are JSON ``{"error": ...}`` like the app's own (see :mod:`.errors`).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json

STATIC_URL = "/static"  # where core mounts the page's scripts and styles
# Answered without the token, to GET and HEAD only: liveness checks carry none, and the page
# and its files are the same for everyone; the API behind them is not.
OPEN_PATHS = frozenset({"/health", "/"})
OPEN_PREFIXES = (STATIC_URL + "/",)
READ_METHODS = frozenset({"GET", "HEAD"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class Guard:
    """ASGI middleware: token, body limits, deadline and disconnects (see the module).

    Args:
        app: the ASGI app behind it.
        max_bytes: the largest request body, in bytes.
        timeout: seconds from a request's arrival until its answer starts.
        token: None, or the bearer token every route requires but the open ones
            (``OPEN_PATHS``, ``OPEN_PREFIXES``).
        allowed_hosts: None, or the host names a ``Host`` header may give (any port).
    """

    DRAIN_LIMIT = 64 << 20  # an oversized body is read (and dropped) up to this, then the 413

    def __init__(self, app, max_bytes: int, timeout: float, token: str | None = None,
                 allowed_hosts: tuple[str, ...] | None = None) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout
        self.expected = None if token is None else token.encode()
        self.hosts = None if allowed_hosts is None else {h.lower().strip("[]") for h in allowed_hosts}
        self.any_address = self.hosts is not None and any(_unspecified(h) for h in self.hosts)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if (host := host_name(scope)) is not None and not self._answers(host):
            names = sorted(h for h in self.hosts if not _unspecified(h))
            return await refuse(send, 403, f"Host {host!r} is not a name this server answers to "
                                           f"({', '.join(names)}{', or an IP address' if self.any_address else ''}); "
                                           f"start it with --allow-host {host} to serve that name")
        if not self._authorized(scope):
            return await refuse(send, 401, "this server wants a token: send \"Authorization: Bearer TOKEN\"",
                                [(b"www-authenticate", b'Bearer realm="transformer"')])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        if scope["method"] not in BODY_METHODS:
            return await self._answer(scope, receive, send, deadline)
        try:
            async with asyncio.timeout_at(deadline):
                body, size, more = await self._read_body(receive)
        except TimeoutError:
            return await refuse(send, 408, f"the request body did not arrive within {self.timeout:g} s")
        if body is None:  # the client went away while sending
            return
        if size > self.max_bytes:
            return await refuse(send, 413, f"request body {'over ' if more else 'of '}{size} bytes; "
                                           f"the limit is {self.max_bytes}")
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as e:
            return await refuse(send, 400, f"request body is not valid UTF-8 (byte 0x{body[e.start]:02x} "
                                           f"at offset {e.start}); send JSON encoded as UTF-8")
        replay, gone = _replay(bytes(body), receive)
        return await self._answer(scope, replay, send, deadline, gone)

    def _answers(self, host: str) -> bool:
        return (self.hosts is None or host in self.hosts
                or (self.any_address and _address(host) is not None))

    def _authorized(self, scope) -> bool:
        if self.expected is None or is_open(scope["method"], scope["path"]):
            return True
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        # The scheme's name is case-insensitive (RFC 9110 11.1): "bearer TOKEN" is the same.
        scheme, _, credentials = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.lstrip(b" "), self.expected)

    async def _read_body(self, receive) -> tuple[bytearray | None, int, bool]:
        """(the body up to max_bytes, its size, whether more was left unread); None for the
        body when the client disconnected. An oversized body is still read (and dropped, up
        to DRAIN_LIMIT bytes) before the answer: a client still sending when the server
        closes often sees a reset, not the 413."""
        body, size, more = bytearray(), 0, True
        while more and size <= self.DRAIN_LIMIT:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, size, more
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_bytes:
                body += chunk
            more = message.get("more_body", False)
        return body, size, more

    async def _answer(self, scope, receive, send, deadline: float, gone: asyncio.Task | None = None) -> None:
        """Run the app; cancel it at the deadline (504 if it has not begun to answer) or when
        ``gone`` (see :func:`_replay`) says the client left before its whole answer."""
        state = {"started": False, "complete": False}

        async def tracked(message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, tracked))
        waiters = {task} | ({gone} if gone is not None else set())
        timeout: float | None = max(0.0, deadline - asyncio.get_running_loop().time())
        timed_out = False
        try:
            while not task.done():
                done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    break
                if gone is not None and gone in done:
                    if not state["complete"]:  # gone before its whole answer: stop working for it
                        task.cancel()
                    waiters.discard(gone)
                    timeout = None
                    continue
                if not state["started"]:
                    timed_out = True
                    task.cancel()
                    break
                timeout = None  # a stream has begun: the deadline was for its first byte
        finally:
            if gone is not None:
                gone.cancel()
            if not task.done():
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not (task.cancelled() and (timed_out or (gone is not None and gone.done()))):
                    raise  # this request itself was cancelled (the server is stopping)
        if timed_out and not state["started"]:
            await refuse(send, 504, f"no answer within {self.timeout:g} s (the server's --timeout); "
                                    "the request was dropped")


def host_name(scope) -> str | None:
    """The host a request's ``Host`` header names, lower-cased, without its port or an IPv6
    address's brackets ("[::1]:8000" -> "::1"); None without the header."""
    value = next((v for k, v in scope["headers"] if k == b"host"), None)
    if value is None:
        return None
    host = value.decode("latin-1").strip().lower()
    if host.startswith("["):  # [IPv6]:port
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _unspecified(host: str) -> bool:
    """Whether ``host`` is 0.0.0.0 or ::, the address of a server listening on every address."""
    address = _address(host)
    return address is not None and address.is_unspecified


def is_open(method: str, path: str) -> bool:
    """Whether a request may pass without the token: a read of a path that holds no data.
    ``path`` is as routed (a ``..`` under /static/ does not leave the static folder:
    Starlette's StaticFiles refuses it with 404)."""
    return method in READ_METHODS and (path in OPEN_PATHS or path.startswith(OPEN_PREFIXES))


def _replay(body: bytes, receive) -> tuple:
    """(a receive that hands the app ``body`` once and then waits for the disconnect, a task
    that ends when the client goes away). The task reads the real ``receive``: after the
    body the server's next message is ``http.disconnect`` (the client left, or the answer
    was sent)."""
    left = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        left.set()

    watcher = asyncio.ensure_future(watch())
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    return replay, watcher


async def refuse(send, status: int, message: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer ``{"error": message}`` with ``status`` and close the connection."""
    payload = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": payload})
