"""A slow client is cut off: one that stops reading its response (`SendTimeout`: each part of a
response must be taken within `send_timeout_s`), and one that stops sending its request
(`CutOffSlowSenders`: its head within `HEAD_TIMEOUT_S`, its body without a pause of
`receive_timeout_s`).

A client that stops reading (a stuck process, a debugger, a page left open) is not a client
that went away: its connection stays open, so nothing notices, and once the socket's buffers
are full the response waits for ever, with its request generating, its lease on the engine
held (a model swap would wait for it) and the old model kept in memory. Past the timeout the
response ends: its request is aborted through the engine's abort path, as for a disconnect,
so the blocks it computed stay as cache, and the connection is closed.

A client that stops sending holds its connection for ever too: uvicorn waits as long as it
takes for a request's head and body, so connections that send nothing, or a header a minute
(slowloris), would hold all `max_connections` and shut every other client out. They are
closed within seconds, and until then the health checks are answered past the limit: a
liveness probe that got 503 while sockets that sent a byte each held every place would have a
supervisor restart a server that was only being held open.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from semantic.api.auth import OPEN_PATHS

log = logging.getLogger(__name__)

# A request's head comes in one write or a few: a connection that sends none whole this long
# after it opened (or after the head's first byte) is idle or a slowloris. At most
# `receive_timeout_s`.
HEAD_TIMEOUT_S = 10.0


class ClientStalled(Exception):
    """The client took nothing of its response for the send timeout."""


class SendTimeout:
    """ASGI middleware, outermost: every message of a response goes out through it, those
    of the middlewares inside included, so none of them waits on such a client either."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_in_time(message: Message) -> None:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await send(message)
            except TimeoutError:
                raise ClientStalled() from None

        try:
            await self.app(scope, receive, send_in_time)
        except* ClientStalled:
            # Everything inside has ended (a stream's iterator closed, which aborted its
            # request); the server closes a connection whose response did not complete.
            client = scope.get("client") or ("unknown",)
            log.warning(
                "%s %s: the client at %s took nothing for send_timeout_s=%g s; cut off",
                scope["method"],
                scope["path"],
                client[0],
                self.timeout_s,
            )


class CutOffSlowSenders(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with deadlines on what the client sends: a request's head
    must have come whole within `head_timeout_s` of its first byte (of the connection, for the
    first request: the time between requests is uvicorn's keep-alive timeout), and its body may
    pause for no longer than `body_timeout_s`. Past one the connection is closed. While the
    server is the one not reading (its flow control paused until the app reads, or a client
    waiting for its `100 Continue`), the clock waits. `with_timeout` makes the class uvicorn is
    given. A health check is served past uvicorn's connection limit (`limit_concurrency`)."""

    head_timeout_s = 10.0
    body_timeout_s = 60.0

    @classmethod
    def with_timeout(cls, receive_timeout_s: float) -> type[CutOffSlowSenders]:
        """The class for `receive_timeout_s`: the body's timeout, and the head's, up to
        HEAD_TIMEOUT_S."""
        head_s = min(HEAD_TIMEOUT_S, receive_timeout_s)
        attributes = {"head_timeout_s": head_s, "body_timeout_s": receive_timeout_s}
        return type(cls.__name__, (cls,), attributes)

    @property
    def limit_concurrency(self) -> int | None:
        """uvicorn reads this as a request's head is parsed, to answer 503 past it: none for
        the health checks, so liveness is told while the limit is full."""
        scope = getattr(self, "scope", None)
        if scope is not None and str(scope["path"]).startswith(OPEN_PATHS):
            return None
        return self._limit_concurrency

    @limit_concurrency.setter
    def limit_concurrency(self, limit: int | None) -> None:
        self._limit_concurrency = limit

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """After each part the client sends: the head's one deadline, the body's from each part,
        and none once the request is whole."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._disarm()
            self._deadline = self.loop.call_later(self.body_timeout_s, self._expired)
        elif state is h11.IDLE and self._deadline is None:
            self._deadline = self.loop.call_later(self.head_timeout_s, self._expired)
        elif state is not h11.IDLE:
            self._disarm()

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        in_body = self.conn.their_state is h11.SEND_BODY
        timeout_s = self.body_timeout_s if in_body else self.head_timeout_s
        if self.flow.read_paused or self.conn.they_are_waiting_for_100_continue:
            self._deadline = self.loop.call_later(timeout_s, self._expired)
            return
        client = self.client[0] if self.client else "unknown"
        log.warning(
            "the client at %s sent no whole request %s within %s=%g s; cut off",
            client,
            "body" if in_body else "head",
            "receive_timeout_s" if in_body else "the head's timeout",
            timeout_s,
        )
        self.transport.close()
