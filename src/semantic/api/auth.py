"""API keys: when any are set, every route but the health checks needs one.

A client sends its key as `x-api-key` (Anthropic SDKs) or `Authorization: Bearer` (OpenAI SDKs,
Claude Code's auth token); either may arrive, or both, and one matching key is enough. A request
without one gets 401 in its protocol's error shape before any route reads its body. Keys are
compared as SHA-256 digests with `hmac.compare_digest`, so the time taken says nothing of a key's
contents or length, and they are never logged: a request that passes carries `key_id_of`, a
short digest of its key, which is what logs and rate limits (rate_limits.py) name it by.
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
_KEY_ID = "api_key_id"  # the request state's name for the key's short digest
_MISSING = "missing API key: send it as x-api-key or Authorization: Bearer"


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
        sent = _sent_keys(request)
        matched = self._match(sent)
        if matched is not None:
            setattr(request.state, _KEY_ID, matched.hex()[:8])  # scope["state"]: seen downstream
            await self.app(scope, receive, send)
            return
        refusal = "invalid API key" if sent else _MISSING
        client = request.client.host if request.client else "unknown"
        log.warning("401 on %s %s from %s: %s", request.method, request.url.path, client, refusal)
        await _unauthorized(request, refusal)(scope, receive, send)

    def _match(self, sent: list[str]) -> bytes | None:
        """The digest of a sent key that is one of ours, or None. Every sent key is checked."""
        matches = [digest for digest in map(_digest, sent) if self._known(digest)]
        return matches[0] if matches else None

    def _known(self, digest: bytes) -> bool:
        # Every stored key is compared, so the time does not tell which one matched.
        return sum(hmac.compare_digest(digest, known) for known in self._digests) > 0


def key_id_of(request: Request) -> str | None:
    """A short digest of the key the request passed with (8 hex digits of its SHA-256), to name
    it in logs and rate limits; None when the server has no keys."""
    key_id: str | None = getattr(request.state, _KEY_ID, None)
    return key_id


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
