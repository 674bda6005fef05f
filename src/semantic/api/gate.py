"""Every request that may use the engine holds a lease on it from its first byte to its last, so a
model swap (`engine/host.py`) never changes the model under a request: it waits for the leases.

A lease is taken in ASGI middleware rather than in each route because a streamed response runs
after its route returns; the middleware's call spans the whole response. Requests that arrive
during a swap wait here (bounded by `swap_wait_s`), then get Overloaded in their protocol's shape.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from semantic.api import errors
from semantic.api.auth import may_administer
from semantic.api.bodies import body_limit
from semantic.engine.host import EngineHost
from semantic.engine.port import EnginePort
from semantic.errors import SemanticError
from semantic.text import client_json

# Routes under these use the engine; the swap route must not (it waits for every lease).
GATED_PATHS = ("/v1/", "/admin/")
UNGATED_PATHS = ("/admin/models",)
# Routes whose JSON body names a model (the APIs' `model` field): with `swap_on_request`, a
# registered alias there swaps to that model before the request leases the engine.
MODEL_ROUTES = frozenset(
    {"/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/v1/completions"}
)


class LeaseEngine:
    """ASGI middleware: lease the host's engine for the request's whole life, and pin it in the
    request's state, where `engine_of` finds it."""

    def __init__(self, app: ASGIApp, host: EngineHost) -> None:
        self.app = app
        self.host = host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or _ungated(path):
            await self.app(scope, receive, send)
            return
        model = None
        if self.host.settings.swap_on_request and path in MODEL_ROUTES:
            model, receive = await _requested_model(receive, body_limit(scope["app"]))
            if model is not None and not may_administer(Request(scope)):
                if self.host.would_swap(model):
                    await _may_not_swap(Request(scope), model)(scope, receive, send)
                    return
                model = None  # never a swap, even if another one changes what is loaded
        try:
            engine = await self.host.acquire(model)
        except SemanticError as exc:
            await errors.semantic_error_response(Request(scope), exc)(scope, receive, send)
            return
        try:
            scope.setdefault("state", {})["engine"] = engine
            await self.app(scope, receive, send)
        finally:
            self.host.release()


def _may_not_swap(request: Request, model: str) -> Response:
    message = (
        f"model {model!r} is not loaded, and only an admin key may swap models "
        "(swap_on_request; admin_api_key)"
    )
    return errors.error_response(request, 403, message, "insufficient_permissions")


def engine_of(request: Request) -> EnginePort:
    """The engine serving this request: the one its lease pinned, else (an ungated route, such
    as a health check) the one loaded now, or Overloaded while a swap has none loaded."""
    pinned: EnginePort | None = getattr(request.state, "engine", None)
    if pinned is not None:
        return pinned
    host: EngineHost = request.app.state.host
    return host.engine


def _ungated(path: str) -> bool:
    return not path.startswith(GATED_PATHS) or path.startswith(UNGATED_PATHS)


async def _requested_model(receive: Receive, limit: int) -> tuple[str | None, Receive]:
    """The body's `model` field (None if there is none, or the body is not JSON or is too
    large to look into), and a `receive` that hands the route the body again."""
    read: list[Message] = []
    size, more = 0, True
    while more and size <= limit:
        message = await receive()
        read.append(message)
        size += len(message.get("body", b""))
        more = message["type"] == "http.request" and message.get("more_body", False)
    model = None if more else _model_field(b"".join(m.get("body", b"") for m in read))

    async def replay() -> Message:
        return read.pop(0) if read else await receive()

    return model, replay


def _model_field(body: bytes) -> str | None:
    try:
        parsed: Any = client_json.loads(body)
    except client_json.NotJson:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None
