"""The connections under the app: uvicorn's h11 protocol, with a deadline for a request's
headers and a connection limit that counts only connections with a request under way.

uvicorn's ``limit_concurrency`` counts every open connection, and nothing bounds how long a
connection may take to send its headers: a few hundred connections that send nothing (or a
header line every few seconds) would get every other client uvicorn's 503, ``/health``
too, for as long as they are held, and a token does not help (uvicorn refuses before the
app's guard runs). Here a connection waiting for a request's headers (just opened, or kept
alive after an answer):

  - is closed when they are not all in within ``header_timeout`` seconds of its opening or
    of its last answer (data trickling in does not move the deadline);
  - does not count against ``limit_concurrency``, which counts the connections with a
    request under way (uvicorn's count of running requests stays as it is);
  - is one of at most ``idle_per_client`` such connections of its client's address: one
    more closes the oldest, so one address cannot hold the server's file descriptors.

uvicorn's set of open connections (``server_state.connections``) still holds every one, so
a shutdown closes them all.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .serve_config import ServeConfig


class Tally:
    """What a server's connections share: those waiting for a request's headers, oldest first
    for each client address, and those with a request under way."""

    def __init__(self, idle_per_client: int) -> None:
        self.idle_per_client = idle_per_client
        self.waiting: dict[str, dict[HeaderDeadline, None]] = {}  # by address; a dict keeps the order
        self.answering: set[HeaderDeadline] = set()

    def wait(self, conn: HeaderDeadline) -> None:
        self.answering.discard(conn)
        mine = self.waiting.setdefault(conn.address, {})
        mine[conn] = None
        while len(mine) > self.idle_per_client:
            next(iter(mine)).hang_up()  # the oldest: its hang_up takes it out of mine

    def answer(self, conn: HeaderDeadline) -> None:
        self.forget_waiting(conn)
        self.answering.add(conn)

    def forget_waiting(self, conn: HeaderDeadline) -> None:
        mine = self.waiting.get(conn.address)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.waiting[conn.address]

    def forget(self, conn: HeaderDeadline) -> None:
        self.forget_waiting(conn)
        self.answering.discard(conn)


class _Counted:
    """Stands in for uvicorn's set of open connections inside the protocol: added to and
    discarded from as that set is, but its length, which uvicorn compares with
    ``limit_concurrency``, is the number of connections with a request under way."""

    def __init__(self, connections: set, tally: Tally) -> None:
        self.connections, self.tally = connections, tally

    def add(self, conn) -> None:
        self.connections.add(conn)

    def discard(self, conn) -> None:
        self.connections.discard(conn)
        self.tally.forget(conn)

    def __len__(self) -> int:
        return len(self.tally.answering)


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol with the bounds above (see the module); ``protocol(cfg)`` makes
    one class per server, with its settings and its :class:`Tally`."""

    header_timeout: float
    tally: Tally

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.connections = _Counted(self.server_state.connections, self.tally)
        self.address = ""
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else ""
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # takes it out of the tally (_Counted.discard)
        self._disarm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def _track(self) -> None:
        """After the parser has read what came (or an answer ended): waiting for a request's
        headers while h11 says the client has not begun one, else answering."""
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            if self.deadline is None:  # set once a wait: trickling data does not move it
                self.deadline = self.loop.call_later(self.header_timeout, self.hang_up)
            self.tally.wait(self)
        else:
            self._disarm()
            self.tally.answer(self)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def hang_up(self) -> None:
        """Close a connection that has not begun a request (its deadline passed, or its
        client holds too many such), as uvicorn closes an idle keep-alive one."""
        self._disarm()
        self.tally.forget(self)
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass
        self.transport.close()


def protocol(cfg: ServeConfig) -> type[HeaderDeadline]:
    """The protocol class for one server (uvicorn's ``http`` setting) with ``cfg``'s bounds."""
    return type("HeaderDeadline", (HeaderDeadline,),
                {"header_timeout": cfg.header_timeout, "tally": Tally(cfg.idle_per_client)})
