"""The HTTP application: routes, error handlers, request ids, the engine's lifetime, and the
index at `/` that says what answers here and where its routes are described."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from starlette.datastructures import MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from semantic import __version__
from semantic.api import (
    admin,
    agents,
    anthropic,
    auth,
    completions,
    docs_pages,
    errors,
    gate,
    models,
    openai,
    openapi,
    responses,
)
from semantic.api.bodies import JsonBodies
from semantic.api.browsers import RefuseForeignPages
from semantic.api.cache_miss import CACHE_MISS_HEADER
from semantic.api.git_snapshots import GitSnapshots
from semantic.api.lifecycle import Lifecycle, LifecycleGate
from semantic.api.rate_limits import LimitByKey, RateLimits
from semantic.api.request_metrics import RequestMetrics
from semantic.api.responses_store import ResponseStore
from semantic.api.slow_clients import SendTimeout
from semantic.engine.host import EngineHost
from semantic.engine.port import EnginePort
from semantic.errors import SemanticError
from semantic.observability import Metrics, bind_request
from semantic.server_key import ServerKey
from semantic.settings.settings import Settings


def create_app(engine: EnginePort | EngineHost, settings: Settings) -> FastAPI:
    """The app serves `engine` (one engine: ours, or one over vLLM replicas; or an `EngineHost`,
    which can swap models); it starts the engine on startup and stops it on shutdown."""
    host = engine if isinstance(engine, EngineHost) else EngineHost(engine, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lifecycle.start()
        try:
            yield
        finally:
            lifecycle.stop()  # after a stop signal's drain (api/server.py): persists every cache

    # /docs and /redoc come from docs_pages, with assets the server serves itself.
    app = FastAPI(
        title="semantic", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.host = host  # the engine: `gate.engine_of(request)`
    app.state.lifecycle = lifecycle = Lifecycle(host)
    app.state.settings = settings
    app.state.rate_limits = RateLimits(settings)
    app.state.started_at = time.time()
    app.state.responses = ResponseStore(settings.cache_dir / "responses")
    app.state.seal_key = ServerKey(settings.cache_dir)  # what thinking blocks are sealed with
    app.state.git_snapshots = GitSnapshots()  # each Claude Code session's first git status
    # The engine's own metrics: the host lends one set to every engine it loads.
    app.state.metrics = Metrics(lambda: host.metrics)
    errors.install(app)
    openapi.install(app)
    # Innermost: a request waits out a model swap only once its key has passed.
    app.add_middleware(gate.LeaseEngine, host=host)
    # Outside the lease: once a stop signal came, new requests get 503 at once, swap or not.
    app.add_middleware(LifecycleGate, lifecycle=lifecycle)
    # Just inside the key check, which names the key the limit counts on.
    app.add_middleware(LimitByKey, limits=app.state.rate_limits)
    # Added early, so it runs inside `RequestIds` and a 401 carries the request id too.
    app.add_middleware(
        auth.RequireApiKey,
        keys=settings.api_keys,
        admin_keys=settings.admin_api_keys,
        limits=app.state.rate_limits,
    )
    app.add_middleware(JsonBodies)
    # Outside the key check (a preflight carries no key) and the refusals above, which an
    # allowed page can then read.
    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=[
                "request-id",
                "x-request-id",
                "retry-after",
                "retry-after-ms",
                CACHE_MISS_HEADER,
            ],
        )
    # Before anything else reads a request: a page refused here learns nothing of keys.
    app.add_middleware(
        RefuseForeignPages,
        allowed_origins=settings.allowed_origins,
        allowed_hosts=settings.allowed_hosts,
    )
    app.add_middleware(RequestIds)
    app.add_middleware(RequestMetrics, metrics=app.state.metrics, router=app.router)
    # Outermost: every message to the client goes through it, the others' included.
    app.add_middleware(SendTimeout, timeout_s=settings.send_timeout_s)
    app.include_router(openai.router)
    app.include_router(completions.router)
    app.include_router(models.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(agents.router)
    app.include_router(admin.router)
    app.add_api_route("/", _index, methods=["GET"], include_in_schema=False)
    docs_pages.install(app)
    return app


async def _index(request: Request) -> dict[str, Any]:
    """What a browser shows first: which server, which model, and where the routes are."""
    try:
        model: str | None = gate.engine_of(request).model.name
    except SemanticError:  # a model swap in progress, or no model could be loaded
        model = None
    return {
        "name": "semantic",
        "version": __version__,
        "model": model,
        "links": {"docs": "/docs", "openapi": "/openapi.json", "health": "/health/ready"},
    }


class RequestIds:
    """ASGI middleware: every request gets an id, echoed in the headers both SDK families read
    and carried by every line it logs. Plain ASGI rather than Starlette's `BaseHTTPMiddleware`,
    which runs the app in a task of its own and relays each part of the response through a
    memory stream: half a millisecond of CPU for a short answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id  # `request.state.request_id`
        bind_request(request_id)

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["request-id"] = request_id
                headers["x-request-id"] = request_id
            await send(message)

        await self.app(scope, receive, with_id)
