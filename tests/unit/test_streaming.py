"""The SSE helpers shared by both APIs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from semantic.api.streaming import after_the_200
from semantic.core import TokenEvent


def test_after_the_200_a_failure_is_the_protocols_error_frame_and_both_streams_close() -> None:
    closed: list[str] = []

    async def engine_events() -> AsyncIterator[TokenEvent]:
        try:
            yield TokenEvent("r", [1], "Hi")
            raise RuntimeError("the disk went away")
        finally:
            closed.append("events")

    async def frames(events: AsyncIterator[TokenEvent]) -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"frame {event.text}"
        finally:
            closed.append("frames")

    async def run() -> list[str]:
        events = engine_events()
        out = after_the_200(frames(events), events, lambda exc: f"error {exc}")
        return [frame async for frame in out]

    assert asyncio.run(run()) == ["frame Hi", "error the disk went away"]
    assert sorted(closed) == ["events", "frames"]
