"""The server's life: starting, serving, draining after a stop signal, stopped.

The health routes report it, and `LifecycleGate` holds every request to it: once a stop signal
came, each new request (but the health checks and the metrics) gets a 503 in its protocol's
shape (the port stays open until the drain is over, so a client learns why instead of finding
it closed), while the requests already running finish. The gate counts those it lets through,
which is how a drain knows that the last response has gone out.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Iterator

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic.api.errors import semantic_error_response
from semantic.engine.host import EngineHost
from semantic.engine.port import EnginePort
from semantic.errors import SemanticError, Unavailable

log = logging.getLogger(__name__)

# After the shutdown timeout cancels what still runs, how long those responses get to send their
# error and close. uvicorn's own graceful-shutdown timeout is the same (`api/server.py`): it
# starts only once the drain is over, so it waits on nothing but these last bytes.
RESPONSE_GRACE_S = 5

# Paths that answer in every phase: the health checks, the metrics, the API description.
ALWAYS_OPEN = ("/health/", "/metrics", "/openapi.json", "/docs", "/redoc")


class Phase(enum.StrEnum):
    STARTING = "starting"  # the engine has not started yet
    SERVING = "serving"
    DRAINING = "draining"  # a stop signal came: running requests finish, new ones get 503
    STOPPED = "stopped"  # the engine stopped and persisted every hot cache


class Lifecycle:
    """Where the server is in its life: STARTING → SERVING → DRAINING → STOPPED. Used on the
    event loop's thread only (the lifespan, the gate, the health routes and the stop signal's
    drain). Which model serves, and swapping it, is the host's business (`engine/host.py`)."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.phase = Phase.STARTING
        self.in_flight = 0  # requests the gate let through whose response has not ended
        self._changed = asyncio.Event()  # a request ended, or a hurry came
        self._hurried = False

    @property
    def started(self) -> bool:
        """The model loaded and the engine started (`/health/startup`): true from then on."""
        return self.phase is not Phase.STARTING

    @property
    def engine(self) -> EnginePort | None:
        """The engine loaded now; None while a swap has none loaded."""
        try:
            return self.host.engine
        except SemanticError:
            return None

    def start(self) -> None:
        self.host.start()
        self.phase = Phase.SERVING

    def stop(self) -> None:
        """Stop the engine, which persists every hot cache; requests are refused from now on."""
        self.phase = Phase.STOPPED
        self.host.stop()

    def not_ready(self) -> str | None:
        """Why a request would not be served now, or None when it would (`/health/ready`)."""
        if self.phase is not Phase.SERVING:
            return self.phase.value
        if self.host.state != "serving":  # swapping, or failed: no model loaded
            return f"model {self.host.state}"
        # The pool is built with the engine, with at least one block: a running engine has it.
        engine = self.engine
        if engine is None:
            return "no engine is loaded"
        if not engine.alive:
            return engine.down_reason
        return None

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests; give those running `timeout_s` to finish, then cancel the rest:
        their clients get a 503, or the protocol's error event mid-stream, rather than a dropped
        connection. Returns once every response has ended, or `RESPONSE_GRACE_S` after the
        cancel. Caches are persisted afterwards, when the engine stops."""
        if self.phase is not Phase.SERVING:
            return
        self.phase = Phase.DRAINING
        log.info("draining: waiting up to %g s for %d requests", timeout_s, self.in_flight)
        if await self._settled_within(timeout_s):
            return
        engine = self.engine
        with contextlib.suppress(TimeoutError):  # an engine thread that does not answer
            async with asyncio.timeout(RESPONSE_GRACE_S):
                if engine is not None and engine.alive:
                    error = Unavailable("the server shut down before this request finished")
                    cancelled = await engine.cancel_all(error)
                    log.warning("shutdown: cancelled %d requests still running", cancelled)
        if not await self._settled_within(RESPONSE_GRACE_S):
            log.warning("shutdown: closing %d responses that are still open", self.in_flight)

    def hurry(self) -> None:
        """Stop waiting for running requests (a second stop signal): cancel them now."""
        self._hurried = True
        self._changed.set()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Count a request in flight while it is answered."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._changed.set()

    async def _settled_within(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False if `timeout_s` or a hurry comes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.in_flight and not self._hurried:
                    self._changed.clear()
                    await self._changed.wait()
        return self.in_flight == 0


class LifecycleGate:
    """ASGI middleware: once the server drains, requests get a 503 in their protocol's shape
    (`ALWAYS_OPEN` paths always pass). Those it lets through are counted in flight until their
    response has ended. (Before the engine starts, uvicorn is not listening yet.)"""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = self.lifecycle
        if scope["type"] != "http" or scope["path"].startswith(ALWAYS_OPEN):
            await self.app(scope, receive, send)
        elif lifecycle.phase in (Phase.DRAINING, Phase.STOPPED):
            refusal = Unavailable("the server is shutting down and takes no new requests")
            await semantic_error_response(Request(scope), refusal)(scope, receive, send)
        else:
            with lifecycle.request():
                await self.app(scope, receive, send)
