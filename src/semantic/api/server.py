"""uvicorn under the server's lifecycle: a stop signal drains the server before uvicorn stops.

On SIGTERM or SIGINT, uvicorn alone closes its port at once, waits for open connections (for
ever, by default) and then runs the app's shutdown. We want more: a client that comes meanwhile
gets a 503 that says why rather than a refused connection, and a running request gets
`shutdown_timeout_s` to finish and then an error it can read. So the first signal drains
(`Lifecycle.drain`) while uvicorn still listens; only then does uvicorn shut down, with a
graceful-shutdown timeout of its own (`RESPONSE_GRACE_S`) that only the drain's last responses
can need. The app's shutdown then stops the engine, which persists every hot cache.

A second signal cuts the drain short: what still runs is cancelled at once, and the caches are
still persisted. A third, once drained, is uvicorn's own: quit without waiting for anything.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from semantic.api.lifecycle import RESPONSE_GRACE_S, Lifecycle
from semantic.api.slow_clients import CutOffSlowSenders
from semantic.settings.settings import Settings

log = logging.getLogger("semantic")


class DrainingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        lifecycle: Lifecycle,
        timeout_s: float,
        ready_line: str | None = None,
    ) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.timeout_s = timeout_s
        self.ready_line = ready_line  # logged once serving has started
        self.drained = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and self.ready_line:
            log.info(self.ready_line)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler. It runs on the event loop's thread between two bytecodes,
        so it only sets flags and hands the loop a callback."""
        if self.should_exit and not self.drained and self._loop is not None:
            self._loop.call_soon_threadsafe(self.lifecycle.hurry)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's main loop asks this every 0.1 s whether to stop; it stops once drained."""
        if self.should_exit and not self.drained:
            await self.lifecycle.drain(self.timeout_s)
            self.drained = True
        return await super().on_tick(counter)


def serve(app: FastAPI, settings: Settings, listener: socket.socket, ready_line: str) -> None:
    """Serve `app` on `listener` (bound before the model loaded, so a port in use failed
    before it) until a stop signal, then drain, shut down and return (the exit status is 0: a
    graceful stop is a success). `ready_line` is logged once it serves."""
    server = DrainingServer(
        uvicorn_config(app, settings), app.state.lifecycle, settings.shutdown_timeout_s, ready_line
    )
    # uvicorn re-raises the stop signal to the handler it found once it has shut down; a no-op
    # one makes the exit status 0.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, lambda signum, frame: None)
    server.run(sockets=[listener])


def uvicorn_config(app: FastAPI, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's records go through our handler (observability.py) too
        timeout_graceful_shutdown=RESPONSE_GRACE_S,
        http=CutOffSlowSenders.with_timeout(settings.receive_timeout_s),
        # uvicorn refuses a request (503) once this many connections are open, its own
        # included: one more, so that `max_connections` of them are served (health checks
        # are served past it: see CutOffSlowSenders).
        limit_concurrency=settings.max_connections + 1,
    )
