"""A client that stops reading is cut off: each part of a response must be taken within
`send_timeout_s`.

A client that stops reading (a stuck process, a debugger, a page left open) is not a client
that went away: its connection stays open, so nothing notices, and once the socket's buffers
are full the response waits for ever, with its request generating, its lease on the engine
held (a model swap would wait for it) and the old model kept in memory. Past the timeout the
response ends: its request is aborted through the engine's abort path, as for a disconnect,
so the blocks it computed stay as cache, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


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
