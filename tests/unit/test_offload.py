"""A small request's work runs on the event loop's thread, a large one's on a worker thread."""

from __future__ import annotations

import asyncio
import threading

from semantic.api import offload


def test_a_small_requests_work_runs_inline_and_a_large_ones_on_a_worker_thread() -> None:
    async def threads() -> tuple[int, int, int]:
        small = await offload.run(offload.INLINE_BODY_BYTES, threading.get_ident)
        large = await offload.run(offload.INLINE_BODY_BYTES + 1, threading.get_ident)
        return threading.get_ident(), small, large

    loop_thread, small, large = asyncio.run(threads())
    assert small == loop_thread
    assert large != loop_thread


def test_the_work_gets_its_arguments_and_returns_its_result_either_way() -> None:
    async def both() -> list[str]:
        return [await offload.run(size, "-".join, ["a", "b"]) for size in (10, 10**6)]

    assert asyncio.run(both()) == ["a-b", "a-b"]
