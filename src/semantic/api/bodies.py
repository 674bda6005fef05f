"""Request bodies under a size limit (the `max_body_mb` setting): a 413 past it (in the
protocol's shape, through errors.py), never a server that buffers whatever a client sends.

FastAPI reads a route's declared body with no limit; routes built with `LimitedBodyRoute` read
it through `read_body` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from semantic.text import client_json


def body_limit(app: Any) -> int:
    """The largest body `app` takes, in bytes. 32 MiB by default, Anthropic's limit too: agent
    histories reach several MB."""
    return int(app.state.settings.max_body_mb) * 2**20


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or a 413 when it is longer than `limit` bytes."""
    # Read to the end even past the limit: a client still sending its body when the answer
    # comes would see a reset connection instead of the 413.
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
    if size > limit:
        raise HTTPException(413, f"request body is {size} bytes; the limit is {limit}")
    return b"".join(chunks)


class _LimitedRequest(Request):
    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            self._body = await read_body(self, body_limit(self.app))
        return self._body

    async def json(self) -> Any:
        """The body's JSON, its nesting bounded (text/client_json.py); a 400 for anything else.
        (FastAPI lets an HTTPException through as it is, where another error becomes a 400
        that does not say what is wrong.)"""
        if not hasattr(self, "_json"):
            try:
                self._json = client_json.loads(await self.body())
            except client_json.NotJson as exc:
                raise HTTPException(400, f"the request body {exc}") from None
        return self._json


class LimitedBodyRoute(APIRoute):
    """A route whose body is read with `read_body` under `body_limit` (the custom request
    class FastAPI documents for changing how a body is read)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def limited(request: Request) -> Response:
            return await handler(_LimitedRequest(request.scope, request.receive))

        return limited
