"""Rate limits: requests per minute for each API key and for each agent, off unless set;
and failed API key attempts per minute for each client address, always on.

Each key and each agent has a token bucket (the algorithm Anthropic's API documents for its own
limits): it holds up to a minute's allowance, refills continuously at that rate, and one request
takes one token. So a client may burst its minute's worth at once, then goes at the rate. A
request that finds its bucket empty gets 429 in its protocol's shape, with `retry-after` saying
when one token will be back (the SDKs retry on their own after it).

The key's limit is checked in `LimitByKey`, after `auth.RequireApiKey` has named the key; the
agent's in each generation route, where the agent is named (a body field, so only the route knows
it). Keys are known here only by `auth.key_id`, a short digest, which is what a 429 logs.

Failed key attempts are counted by `auth.RequireApiKey`: each 401 takes a token from its client
address's bucket, and an address whose bucket is empty gets 429 for each further wrong or
missing key. A right key from that address still passes: a client that keeps sending a stale
key must not lock out a working one beside it (on loopback, every local client shares one
address). So the limit keeps wrong keys from costing the server more than
`auth_failures_per_minute` answers and log lines each; it cannot slow a guesser who tells a 200
from a 429, and no per-address limit could stop one with many addresses: a key's length is
what keeps it from being guessed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic.api import errors
from semantic.api.auth import OPEN_PATHS, caller_of, key_id_of
from semantic.errors import RateLimited
from semantic.settings.settings import Settings

log = logging.getLogger(__name__)

# The key of every request when the server has no API keys: all clients share one budget.
ANONYMOUS = "anonymous"
# Past this many names, buckets that have refilled (the same as no bucket) are dropped.
PRUNE_ABOVE = 10_000

Clock = Callable[[], float]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float  # when `tokens` was last brought up to date, on the limiter's clock


class RateLimiter:
    """A token bucket of `per_minute` requests for each name. Used from the event loop only,
    so it takes no lock. A name never seen has a full bucket."""

    def __init__(self, per_minute: int, clock: Clock = time.monotonic) -> None:
        self.per_minute = per_minute
        self._per_second = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, name: str) -> float:
        """Take one request from `name`'s bucket: 0.0 when it had one; else the seconds until it
        will, and nothing is taken."""
        now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None:
            self._prune(now)
            bucket = self._buckets[name] = _Bucket(float(self.per_minute), now)
        bucket.tokens = self._refilled(bucket, now)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self._per_second

    def wait_s(self, name: str) -> float:
        """Seconds until `name`'s bucket holds a request again; 0.0 when it does now. Takes
        nothing."""
        bucket = self._buckets.get(name)
        if bucket is None:
            return 0.0
        tokens = self._refilled(bucket, self._clock())
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self._per_second

    def __len__(self) -> int:
        return len(self._buckets)

    def _refilled(self, bucket: _Bucket, now: float) -> float:
        elapsed = max(0.0, now - bucket.updated)
        return min(float(self.per_minute), bucket.tokens + elapsed * self._per_second)

    def _prune(self, now: float) -> None:
        """Forget the names whose buckets are full again, so that many names seen once (agents
        come and go) do not grow memory for ever."""
        if len(self._buckets) < PRUNE_ABOVE:
            return
        full = [
            name
            for name, bucket in self._buckets.items()
            if self._refilled(bucket, now) >= self.per_minute
        ]
        for name in full:
            del self._buckets[name]


class RateLimits:
    """The server's limits, from its settings: per key and per agent (either may be off, None),
    and failed key attempts per client address."""

    def __init__(self, settings: Settings, clock: Clock = time.monotonic) -> None:
        key_rpm, agent_rpm = settings.rate_limit_key_rpm, settings.rate_limit_agent_rpm
        self.by_key = RateLimiter(key_rpm, clock) if key_rpm else None
        self.by_agent = RateLimiter(agent_rpm, clock) if agent_rpm else None
        self.auth_failures = RateLimiter(settings.auth_failures_per_minute, clock)

    def check_address(self, address: str) -> None:
        """RateLimited when `address` has failed its key too often to try another now."""
        wait_s = self.auth_failures.wait_s(address)
        if wait_s > 0:
            raise RateLimited(
                "Too many requests with a wrong API key from this address: limit "
                f"{self.auth_failures.per_minute} per minute. Please try again in "
                f"{math.ceil(wait_s)}s.",
                retry_after_s=wait_s,
            )

    def failed_auth(self, address: str) -> None:
        """Count a request from `address` that was refused for its key."""
        self.auth_failures.admit(address)

    def check_key(self, key_id: str) -> None:
        """RateLimited when this key (or, with no keys set, the server) is over its limit."""
        if self.by_key is None:
            return
        wait_s = self.by_key.admit(key_id)
        if wait_s > 0:
            who = "this server" if key_id == ANONYMOUS else "this API key"
            raise _limited(who, self.by_key.per_minute, wait_s)

    def check_agent(self, agent_id: str | None, owner: str | None = None) -> None:
        """RateLimited when the agent (`agent_id` of `owner`'s: two keys' agents of one id are
        two agents) is over its limit; a request naming no agent has none."""
        if self.by_agent is None or agent_id is None:
            return
        wait_s = self.by_agent.admit(f"{owner}/{agent_id}")
        if wait_s > 0:
            raise _limited(f"agent {agent_id!r}", self.by_agent.per_minute, wait_s)


def _limited(who: str, per_minute: int, wait_s: float) -> RateLimited:
    return RateLimited(
        f"Rate limit reached for requests per minute on {who}: limit {per_minute}. "
        f"Please try again in {math.ceil(wait_s)}s.",
        retry_after_s=wait_s,
    )


def check_agent(request: Request, agent_id: str | None) -> None:
    """For a route, once it knows the agent it serves: RateLimited past the agent's limit."""
    limits: RateLimits = request.app.state.rate_limits
    try:
        limits.check_agent(agent_id, caller_of(request).owner)
    except RateLimited as exc:
        _log_refusal(request, f"agent {agent_id}", exc)
        raise


class LimitByKey:
    """ASGI middleware, just inside `auth.RequireApiKey`: every request but the health checks
    counts against its key's limit."""

    def __init__(self, app: ASGIApp, limits: RateLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(OPEN_PATHS):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        key_id = key_id_of(request) or ANONYMOUS
        try:
            self.limits.check_key(key_id)
        except RateLimited as exc:
            _log_refusal(request, f"key {key_id}", exc)
            await errors.semantic_error_response(request, exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _log_refusal(request: Request, who: str, exc: RateLimited) -> None:
    log.info(
        "429 on %s %s for %s: retry in %.1f s",
        request.method,
        request.url.path,
        who,
        exc.retry_after_s,
    )
