"""Web pages cannot use the server. Every page a user opens can send requests to
`http://127.0.0.1:8000`; two checks keep them out (docs/operations.md, "Security model"):

- Origin. A browser names the page a request comes from in `Origin`. A request that names
  another origin than the server's own (the one its `Host` header names: the server's own
  pages, `/docs`) is refused, unless `allowed_origins` names it; so is `Origin: null` (a
  sandboxed frame, a file). Clients that are not browsers send no `Origin` and pass.
- Host. With DNS rebinding, a page at `attacker.example` has its name resolve to 127.0.0.1:
  its requests then reach us as same-origin, and it reads the answers (every agent's system
  prompt, conversations). Such a request still names the page's host in `Host`. So a request
  that arrived on a loopback address must name a loopback host (`localhost`, a loopback IP such
  as `127.0.0.1` or `[::1]`, any port) or one of `allowed_hosts`.

A refusal is a 403 in the request's protocol (`permission_error`), logged with the client's
address. Pages of `allowed_origins` also get CORS headers (and preflights an answer), so that
they can read the answers they are allowed to ask for. A page cannot send a form as a request
either (api/bodies.py), whatever its origin.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic.api import errors

log = logging.getLogger(__name__)

ORIGIN_REFUSED = "origin_not_allowed"
HOST_REFUSED = "host_not_allowed"


class RefuseForeignPages:
    """ASGI middleware, outside the key check: a page refused here learns nothing of keys."""

    def __init__(
        self, app: ASGIApp, allowed_origins: Iterable[str], allowed_hosts: Iterable[str]
    ) -> None:
        self.app = app
        self.allowed_origins = frozenset(origin.lower() for origin in allowed_origins)
        self.allowed_hosts = frozenset(host.lower() for host in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        message, code = refusal
        request = Request(scope)
        client = request.client.host if request.client else "unknown"
        log.warning("403 on %s %s from %s: %s", request.method, request.url.path, client, message)
        await errors.error_response(request, 403, message, code)(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[str, str] | None:
        """(why, the OpenAI error code) when the request is refused, else None."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if _on_loopback(scope) and not self._host_allowed(host):
            return (
                f"Host {host!r} is not a name of this server: on a loopback address it answers "
                "only to localhost, 127.0.0.1 and [::1] (allowed_hosts adds more)",
                HOST_REFUSED,
            )
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return (
                f"requests from web pages of {origin!r} are refused: a page of another origin "
                "may use this server only when allowed_origins names it",
                ORIGIN_REFUSED,
            )
        return None

    def _host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return is_loopback_name(name) or name in self.allowed_hosts

    def _origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if origin in self.allowed_origins:
            return True
        scheme, separator, authority = origin.partition("://")
        same = bool(host) and authority == host.strip().lower()
        return bool(separator) and scheme in ("http", "https") and same


def host_name(host: str) -> str:
    """The name a Host header gives, without its port: `[::1]:8000` → `[::1]`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.partition(":")[0]


def is_loopback_name(name: str) -> bool:
    """`localhost` or a loopback IP literal (bracketed, for IPv6): names no DNS answer can
    move to another machine."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def _on_loopback(scope: Scope) -> bool:
    """Whether the request came to a loopback address of ours (always, when the server is
    bound to one): the connections a page's rebound name can reach."""
    server = scope.get("server")
    return server is not None and is_loopback_name(str(server[0]))
