"""The response header that says where and why a request's prompt missed the cache, the same
for every API, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from semantic.core import Request, TokenEvent

if TYPE_CHECKING:
    from semantic.engine.port import EnginePort

CACHE_MISS_HEADER = "x-semantic-cache-miss"
# How /openapi.json declares it on the routes that send it.
CACHE_MISS_HEADER_DOC: dict[str, Any] = {
    CACHE_MISS_HEADER: {
        "description": "Where and why the prompt missed the cache, when it could have been "
        "served from it further: `position=<first token not served>; reason=<reason>` "
        "(prompt_changed, evicted, corrupt, window_passed, other_model, never_seen).",
        "schema": {"type": "string"},
    }
}


async def stream(
    engine: EnginePort, request: Request
) -> tuple[AsyncIterator[TokenEvent], dict[str, str]]:
    """Submit `request` as `Engine.stream` does, and wait for the engine to take it in (its
    first event, which comes before any token, so a stream's 200 waits at most a step for it):
    the request's events, and the header naming the position of the prompt's first token the
    cache did not serve and why, e.g. `position=1234; reason=prompt_changed`; no header when it
    missed nothing it could have had."""
    events = engine.stream(request, announce=True)
    miss = (await anext(events)).cache_miss
    if miss is None:
        return events, {}
    return events, {CACHE_MISS_HEADER: f"position={miss.position}; reason={miss.reason}"}
