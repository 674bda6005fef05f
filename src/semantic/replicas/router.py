"""Which vLLM replica serves a request: each agent sticks to one replica, where its prefix is
cached, unless that replica is saturated or down.

Rendezvous (highest-random-weight) hashing ranks the replicas for each routing key; the first
healthy one is the key's home. Taking a replica out moves only the keys it was home to (each
to its next-ranked replica) and leaves every other key where it is; a replica that comes back
gets exactly its keys back. Load spills over, as cache-aware routers do: when the home already
has `spill_in_flight` requests running, the request goes to the least-loaded healthy replica
(a cold prefix there beats a queue here).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from semantic.core import Request

# An anonymous request is routed by its prompt's opening tokens: requests that share them (a
# system prompt, a conversation's first turn) share a replica, and so its cached prefix.
ROUTE_PREFIX_TOKENS = 256


@dataclass(slots=True)
class Replica:
    """One vLLM server. `in_flight` counts the requests routed to it that have not ended;
    `model_id` is the name it serves the model under and `max_model_len` the longest sequence
    it takes (its /v1/models, its `--max-model-len`), once it has answered. It is out of the
    routing (`healthy` False) until its first health check and its /v1/models have answered:
    until then its length is unknown, and a prompt checked against the model's own context
    could be one the replica refuses. `slow_checks` counts its health checks in a row that
    timed out (a busy replica's, which stays in the routing for a while)."""

    url: str
    healthy: bool = False
    slow_checks: int = 0
    in_flight: int = 0
    routed: int = 0  # requests ever routed here
    spilled: int = 0  # of those, requests whose home was saturated
    model_id: str | None = None
    max_model_len: int | None = None


class NoReplica(Exception):
    """Every replica is out of the routing."""


class Router:
    """The replicas and their load. Used on the event loop's thread only (no locks).

    Invariant: a replica's `in_flight` is the number of `route` calls for it not yet matched by
    `done`; only healthy replicas are routed to.
    """

    def __init__(self, urls: Iterable[str], spill_in_flight: int) -> None:
        self.replicas = [Replica(url) for url in urls]
        self.spill_in_flight = spill_in_flight

    def route(self, key: str) -> Replica:
        """The replica for a request with routing `key`, counted in flight until `done`."""
        home = self.home(key)
        chosen = home
        if home.in_flight >= self.spill_in_flight:
            least = min(self._healthy(), key=lambda r: r.in_flight)
            if least.in_flight < home.in_flight:
                chosen = least
                chosen.spilled += 1
        chosen.in_flight += 1
        chosen.routed += 1
        return chosen

    def done(self, replica: Replica) -> None:
        replica.in_flight -= 1

    def home(self, key: str) -> Replica:
        """The healthy replica ranked first for `key`; `NoReplica` when none is healthy."""
        healthy = self._healthy()
        if not healthy:
            raise NoReplica("no vLLM replica is healthy")
        return max(healthy, key=lambda replica: _weight(replica.url, key))

    def ranked(self, key: str) -> list[Replica]:
        """The healthy replicas in `key`'s order of preference (a retry's next choice)."""
        return sorted(self._healthy(), key=lambda r: _weight(r.url, key), reverse=True)

    def mark(self, replica: Replica, healthy: bool) -> bool:
        """Set a replica's health; whether it changed."""
        changed = replica.healthy != healthy
        replica.healthy = healthy
        return changed

    def _healthy(self) -> list[Replica]:
        return [replica for replica in self.replicas if replica.healthy]


def routing_key(request: Request) -> str:
    """What a request is routed by: its agent (named by the client, or a Responses chain's),
    scoped by its owner; else the owner and the prompt's first `ROUTE_PREFIX_TOKENS` tokens
    (an implicit conversation: its turns grow the same prompt, so they open alike)."""
    owner = request.owner or ""
    if request.agent_id is not None:
        return f"agent\0{owner}\0{request.agent_id}"
    opening = request.prompt_token_ids[:ROUTE_PREFIX_TOKENS]
    digest = hashlib.blake2b(repr(opening).encode(), digest_size=16).hexdigest()
    return f"prefix\0{owner}\0{digest}"


def _weight(url: str, key: str) -> int:
    digest = hashlib.blake2b(f"{url}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
