"""Request bodies: JSON, whatever most clients say (`JsonBodies`), but never a form from a web
page; and under a size limit (the `max_body_mb` setting): a 413 past it (in the protocol's shape,
through errors.py), never a server that reads whatever a client sends.

FastAPI reads a route's declared body with no limit; routes built with `LimitedBodyRoute` read
it through `read_body` instead, and routes that read their body by hand through `parse_body`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic.api import errors, offload
from semantic.errors import InvalidRequest
from semantic.text import client_json

# The types a web page may send to another site without asking it first (a CORS "simple
# request"): a form, a multipart form, plain text.
PAGE_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class JsonBodies:
    """ASGI middleware: every body this server takes is JSON, whatever the client's
    content-type says (`curl -d` sends a form type, some clients none), so a body's type is
    made `application/json` for the routes, except where a web page could have sent it: a form
    or text type with an `Origin` (only browsers send one) is a 415. Read as JSON, such a
    request would be a command any page could give (api/browsers.py refuses pages of other
    origins; this holds for every page)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind in PAGE_TYPES and "origin" in headers:
            message = (
                f"a request body of type {kind} from a web page is refused: send JSON, as "
                "content-type: application/json"
            )
            await errors.error_response(Request(scope), 415, message)(scope, receive, send)
            return
        others = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
        scope = {**scope, "headers": [*others, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def body_limit(app: Any) -> int:
    """The largest body `app` takes, in bytes. 32 MiB by default, Anthropic's limit too: agent
    histories reach several MB."""
    return int(app.state.settings.max_body_mb) * 2**20


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or a 413 as soon as it is known to be longer than `limit` bytes: by its
    Content-Length, before a byte is read; else (a chunked body) once `limit` bytes have come.
    What is past the limit is never read: the 413 closes the connection, so a client still
    sending may see it reset instead (curl, which asks `Expect: 100-continue` before a large
    body, sends none of it and reads the 413)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(f"request body is {int(declared)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(message: str) -> HTTPException:
    # The rest of the body is unread, so the connection cannot carry another request.
    return HTTPException(413, message, headers={"connection": "close"})


class _LimitedRequest(Request):
    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            self._body = await read_body(self, body_limit(self.app))
        return self._body

    async def json(self) -> Any:
        """The body's JSON, its nesting bounded (text/client_json.py); a 400 for anything else.
        (FastAPI lets an HTTPException through as it is, where another error becomes a 400
        that does not say what is wrong.) A large body is parsed on a worker thread
        (api/offload.py)."""
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = await offload.run(len(body), client_json.loads, body)
            except client_json.NotJson as exc:
                raise HTTPException(400, f"the request body {exc}") from None
        return self._json


class LimitedBodyRoute(APIRoute):
    """A route whose body is read with `read_body` under `body_limit` (the custom request
    class FastAPI documents for changing how a body is read), and checked by `check_body`
    before FastAPI validates it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def limited(request: Request) -> Response:
            request = _LimitedRequest(request.scope, request.receive)
            await self.check_body(request)
            return await handler(request)

        return limited

    async def check_body(self, request: Request) -> None:
        """What a kind of route checks on its body before FastAPI validates it, raising what
        errors.py answers in the protocol's shape (inside FastAPI's own reading of the body,
        any error but an HTTPException becomes a bare 400). Nothing here."""


B = TypeVar("B", bound=BaseModel)


async def parse_body(request: Request, schema: type[B]) -> B:
    """The body as `schema`: a 413 past the size limit, a 400 for anything that is not a JSON
    object of the right shape (never a 500: deep nesting and invalid UTF-8 included)."""
    raw = await read_body(request, body_limit(request.app))
    try:
        data = client_json.loads(raw)
    except client_json.NotJson as exc:
        raise InvalidRequest(f"the request body {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from exc
