"""API keys: when any are set, every route but the health checks needs one.

A client sends its key as `x-api-key` (Anthropic SDKs) or `Authorization: Bearer` (OpenAI SDKs,
Claude Code's auth token); either may arrive, or both, and one matching key is enough. A request
without one gets 401 in its protocol's error shape before any route reads its body. Keys are
compared as SHA-256 digests with `hmac.compare_digest`, so the time taken says nothing of a key's
contents or length, and they are never logged: a request that passes carries `key_id_of`, a
short digest of its key, which is what logs and rate limits (rate_limits.py) name it by.

Admin keys are keys too, and once any is set they are the only ones the admin routes take (model
swap, cache persist and evict, and `/metrics`, whose agent and request counts show every key's
activity): any other known key gets 403, as a key that lacks permission, and only they may swap
models by naming one in a request (`swap_on_request`). With no admin key set, every key reaches
every route.

Agents belong to the key that made them: a request carries its key's owner digest
(`caller_of`), and `engine/agent_door.py` shows each key its own agents only, an admin key
every key's. With no keys at all, there is one owner, and every client is it.

Wrong keys are throttled, right ones never: each 401 counts against its client address
(rate_limits.py), and an address over `auth_failures_per_minute` gets 429 for each further
wrong or missing key until its allowance refills. A request with a right key passes whatever
its address sent before, so a misconfigured client (or a scanner) beside a working one on the
same address, loopback above all, does not lock the working one out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic.api import errors
from semantic.core import Caller
from semantic.errors import RateLimited

if TYPE_CHECKING:  # rate_limits.py imports this module
    from semantic.api.rate_limits import RateLimits

log = logging.getLogger(__name__)

# Health checks answer without a key, so supervisors and load balancers need none.
OPEN_PATHS = ("/health/",)
ADMIN_PATHS = ("/admin/", "/metrics")
_KEY_ID = "api_key_id"  # the request state's name for the key's short digest
_ADMIN = "api_key_admin"  # the request state's name for whether the key may administer
_OWNER = "api_key_owner"  # the request state's name for the owner digest of its agents
_ADMIN_KEY = "api_key_is_admin_key"  # … for whether it is an admin key (sees every agent)
_MISSING = "missing API key: send it as x-api-key or Authorization: Bearer"
_NOT_ADMIN = "this API key may not use the admin routes: send an admin key (admin_api_key)"


class RequireApiKey:
    """ASGI middleware in front of the routes. With no keys configured every request passes:
    the server is then on loopback (`semantic serve` refuses a remote bind without a key)."""

    def __init__(
        self,
        app: ASGIApp,
        keys: Iterable[str],
        admin_keys: Iterable[str] = (),
        *,
        limits: RateLimits,
    ) -> None:
        self.app = app
        self.limits = limits
        self._admin_digests = [_digest(key) for key in admin_keys]
        self._digests = [_digest(key) for key in keys] + self._admin_digests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._digests or scope["path"].startswith(OPEN_PATHS):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        sent = _sent_keys(request)
        matched = _match(sent, self._digests)
        if matched is None:
            await self._refuse(request, bool(sent))(scope, receive, send)
            return
        admin_key = _match(sent, self._admin_digests) is not None
        admin = admin_key or not self._admin_digests
        # scope["state"]: seen downstream. The key id (logs) is the owner digest's start.
        setattr(request.state, _KEY_ID, matched.hex()[:8])
        setattr(request.state, _OWNER, owner_digest(matched))
        setattr(request.state, _ADMIN, admin)
        setattr(request.state, _ADMIN_KEY, admin_key)
        if scope["path"].startswith(ADMIN_PATHS) and not admin:
            _log_refusal(request, 403, _NOT_ADMIN)
            await _forbidden(request)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refuse(self, request: Request, sent: bool) -> Response:
        """A request without a right key: 401, counted against its address; 429 once the
        address is over its allowance of them."""
        address = request.client.host if request.client else "unknown"
        try:
            self.limits.check_address(address)
        except RateLimited as exc:
            _log_refusal(request, 429, "too many wrong keys")
            return errors.semantic_error_response(request, exc)
        self.limits.failed_auth(address)
        refusal = "invalid API key" if sent else _MISSING
        _log_refusal(request, 401, refusal)
        return _unauthorized(request, refusal)


def key_id_of(request: Request) -> str | None:
    """A short digest of the key the request passed with (8 hex digits of its SHA-256), to name
    it in logs and rate limits; None when the server has no keys."""
    key_id: str | None = getattr(request.state, _KEY_ID, None)
    return key_id


def may_administer(request: Request) -> bool:
    """Whether the request's key may use the admin routes and swap models: an admin key, or
    any key (or none) when the server has no admin keys."""
    admin: bool = getattr(request.state, _ADMIN, True)
    return admin


def caller_of(request: Request) -> Caller:
    """Who the request asks about agents as: its key's owner scope, and whether it sees every
    owner's agents (an admin key). On a server without keys, everyone is the one owner (None),
    and sees everything."""
    owner: str | None = getattr(request.state, _OWNER, None)
    if owner is None:
        return Caller(None, admin=True)
    return Caller(owner, admin=bool(getattr(request.state, _ADMIN_KEY, False)))


def owner_digest(key_digest: bytes) -> str:
    """The owner of a key's agents, as manifests record it: the first 128 bits of the key's
    SHA-256, in hex (the key's id in the logs is its first 8 digits)."""
    return key_digest.hex()[:32]


def _match(sent: list[str], digests: list[bytes]) -> bytes | None:
    """The digest of a sent key that is one of `digests`, or None. Every sent key is checked,
    each against every digest, so the time does not tell which one matched."""
    matches = [digest for digest in map(_digest, sent) if _known(digest, digests)]
    return matches[0] if matches else None


def _known(digest: bytes, digests: list[bytes]) -> bool:
    return sum(hmac.compare_digest(digest, known) for known in digests) > 0


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


def _forbidden(request: Request) -> Response:
    return errors.error_response(request, 403, _NOT_ADMIN, "insufficient_permissions")


def _log_refusal(request: Request, status: int, reason: str) -> None:
    client = request.client.host if request.client else "unknown"
    log.warning("%d on %s %s from %s: %s", status, request.method, request.url.path, client, reason)
