"""The HTTP application: routes, error handlers, request ids, and the engine's lifetime."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic import __version__
from semantic.api import admin, agents, anthropic, auth, errors, openai, openapi
from semantic.config import Settings
from semantic.engine.engine import Engine


def create_app(engine: Engine, settings: Settings) -> FastAPI:
    """The app serves `engine`; it starts the engine thread on startup and stops it on
    shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="semantic", version=__version__, lifespan=lifespan)
    app.state.engine = engine
    app.state.settings = settings
    app.state.started_at = time.time()
    errors.install(app)
    openapi.install(app)
    # Added first, so it runs inside `_request_id` and a 401 carries the request id too.
    app.add_middleware(auth.RequireApiKey, keys=settings.api_keys)
    app.middleware("http")(_request_id)
    app.add_middleware(_JSONBodies)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(agents.router)
    app.include_router(admin.router)
    return app


async def _request_id(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    """Every request gets an id, echoed in the headers both SDK families read."""
    request_id = f"req_{uuid.uuid4().hex}"
    request.state.request_id = request_id
    response = await call_next(request)
    response.headers["request-id"] = request_id
    response.headers["x-request-id"] = request_id
    return response


class _JSONBodies:
    """Every body this server takes is JSON, whatever the client's content-type says:
    `curl -d` sends `application/x-www-form-urlencoded`, and some clients send none."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
