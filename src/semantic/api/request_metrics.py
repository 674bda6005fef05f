"""Every HTTP request counted and timed, by route and status (the catalog: observability.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from starlette.routing import BaseRoute, Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from semantic.observability import Metrics

UNMATCHED = "unmatched"


class RequestMetrics:
    """ASGI middleware, outside the others of `create_app`: it sees every answer they give (a
    401, a 503 while draining, an unknown path) and times a stream to its last byte, which a
    middleware that returns with the response headers (Starlette's `BaseHTTPMiddleware`)
    cannot."""

    def __init__(self, app: ASGIApp, metrics: Metrics, router: Router) -> None:
        self.app = app
        self.metrics = metrics
        self.router = router
        self._flat: list[BaseRoute] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what Starlette's error handler answers when the app raises before a start

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            elapsed = time.perf_counter() - start
            self.metrics.request_done(route_of(self._routes(), scope), status, elapsed)

    def _routes(self) -> list[BaseRoute]:
        """Listed at the first request, once every router is included."""
        if self._flat is None:
            self._flat = list(flat_routes(self.router.routes))
        return self._flat


def route_of(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The template of the route a request is for (`/v1/agents/{agent_id}`, also when its
    method is refused), never its raw path: the label then has as many values as there are
    routes, whatever clients send."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            return str(getattr(route, "path", UNMATCHED))
    return UNMATCHED


def flat_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, through included routers (newer FastAPI keeps them nested; ours are
    included without a prefix, so their routes' paths are whole)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from flat_routes(inner.routes) if inner is not None else [route]
