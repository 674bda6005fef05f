"""API keys: when any are set, every route but the health checks needs one.

A client sends its key as `x-api-key` (Anthropic SDKs) or `Authorization: Bearer` (OpenAI SDKs,
Claude Code's auth token); either may arrive, or both, and one matching key is enough. A request
without one gets 401 in its protocol's error shape before any route reads its body. Keys are
compared as SHA-256 digests with `hmac.compare_digest`, so the time taken says nothing of a key's
contents or length, and they are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable

from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic.api import errors

log = logging.getLogger(__name__)

# Health checks answer without a key, so supervisors and load balancers need none.
OPEN_PATHS = ("/health/",)


class RequireApiKey:
    """ASGI middleware in front of the routes. With no keys configured every request passes:
    the server is then on loopback (`semantic serve` refuses a remote bind without a key)."""

    def __init__(self, app: ASGIApp, keys: Iterable[str]) -> None:
        self.app = app
        self._digests = [_digest(key) for key in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._digests or scope["path"].startswith(OPEN_PATHS):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        client = request.client.host if request.client else "unknown"
        log.warning("401 on %s %s from %s: %s", request.method, request.url.path, client, refusal)
        await _unauthorized(request, refusal)(scope, receive, send)

    def _refusal(self, request: Request) -> str | None:
        """Why the request may not pass, or None when a key it sent is one of ours."""
        sent = _sent_keys(request)
        if not sent:
            return "missing API key: send it as x-api-key or Authorization: Bearer"
        if not any([self._known(key) for key in sent]):
            return "invalid API key"
        return None

    def _known(self, key: str) -> bool:
        digest = _digest(key)
        # Every stored key is compared, so the time does not tell which one matched.
        return sum(hmac.compare_digest(digest, known) for known in self._digests) > 0


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _sent_keys(request: Request) -> list[str]:
    sent = [request.headers.get("x-api-key", "")]
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    if scheme.lower() == "bearer":
        sent.append(token)
    return [key for key in sent if key]


def _unauthorized(request: Request, message: str) -> Response:
    if errors.protocol_of(request) == "anthropic":
        response: Response = errors.anthropic_error(request, 401, message)
    else:
        response = errors.openai_error(
            401, message, "invalid_request_error", code="invalid_api_key"
        )
    response.headers["www-authenticate"] = "Bearer"  # a 401 names the scheme it wants (RFC 9110)
    return response
