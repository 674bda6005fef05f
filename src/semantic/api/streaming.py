"""Server-sent events for every API: framing, keep-alive, and abort when the client goes away.

The one place that knows SSE bytes. Protocol modules hand it an async
iterator of already-framed events and get a response back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from semantic.core import TokenEvent

T = TypeVar("T")

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


def _compact(payload: dict[str, Any]) -> str:
    # One line of JSON: a raw newline inside `data:` would split the event.
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def data_event(payload: dict[str, Any]) -> str:
    """An unnamed event (OpenAI chunks)."""
    return f"data: {_compact(payload)}\n\n"


def named_event(name: str, payload: dict[str, Any]) -> str:
    """A named event (Anthropic: the SDKs select events by name)."""
    return f"event: {name}\ndata: {_compact(payload)}\n\n"


def anthropic_event(payload: dict[str, Any]) -> str:
    """An Anthropic event, named after its payload's `type` (the SDKs read the name, the
    accumulators the type: they must agree)."""
    return named_event(str(payload["type"]), payload)


DONE = "data: [DONE]\n\n"
KEEP_ALIVE = ": keep-alive\n\n"  # OpenAI: a comment, since every `data:` must be JSON
PING = anthropic_event({"type": "ping"})  # Anthropic: the heartbeat its SDKs know and skip


async def whole_answer(events: AsyncIterator[TokenEvent]) -> tuple[str, TokenEvent]:
    """A non-streamed answer: all of its text and its final event; an engine error raises."""
    text: list[str] = []
    async for event in events:
        if event.error is not None:
            raise event.error
        text.append(event.text)
        if event.final:
            return "".join(text), event
    raise RuntimeError("the engine ended a request without a final event")


async def after_the_200(
    frames: AsyncIterator[str],
    events: AsyncIterator[TokenEvent],
    error_frame: Callable[[Exception], str],
) -> AsyncIterator[str]:
    """`frames`, made from the engine's `events`, once the 200 is sent: an exception can then
    only be the protocol's error event, and closing this (a client that went away) closes the
    engine's stream, which aborts the request."""
    try:
        async for frame in frames:
            yield frame
    except Exception as exc:
        log.exception("a stream failed after its 200")
        yield error_frame(exc)
    finally:
        await close_iterator(frames)
        await close_iterator(events)


async def close_iterator(iterator: AsyncIterator[Any]) -> None:
    """Close `iterator` where it can be closed (an async generator: the engine's stream, whose
    closing aborts its request)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def prefill_comments(progress: Callable[[], tuple[int, int] | None]) -> Callable[[], str]:
    """The OpenAI APIs' heartbeat, saying how far the prompt is prefilled while it still is
    (`progress` gives tokens done and in all): a comment has room for it, clients skip it."""

    def comment() -> str:
        done_and_total = progress()
        if done_and_total is None or done_and_total[0] >= done_and_total[1]:
            return KEEP_ALIVE
        done, total = done_and_total
        return f": prefill {done}/{total} tokens\n\n"

    return comment


async def with_keep_alive(
    events: AsyncIterator[str],
    interval_s: float,
    keep_alive: str | Callable[[], str] = KEEP_ALIVE,
) -> AsyncIterator[str]:
    """Pass `events` through, inserting `keep_alive` (the protocol's heartbeat: `KEEP_ALIVE` or
    `PING`, or a function that makes one, with the prefill's progress) whenever none came for
    `interval_s` (a long prefill must not look like a dead connection). Closing this closes
    `events`.

    `events` are read by a task of their own into a queue, and a timer looks at the silence
    once an interval: a wait with a timeout (a task and a timer) for every event cost more
    than a streamed token's whole framing."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | _Mark] = asyncio.Queue()
    reader = loop.create_task(_read_into(events, queue))
    silence = _Silence(loop, queue, interval_s)
    try:
        while True:
            item = await queue.get()
            if isinstance(item, str):
                silence.broken()
                yield item
            elif item is _BEAT:
                if queue.empty():  # nothing else to send
                    silence.broken()
                    yield keep_alive if isinstance(keep_alive, str) else keep_alive()
            elif isinstance(item, _Failed):
                raise item.error
            else:
                return
    finally:
        silence.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await close_iterator(events)


class _Mark:
    """What `with_keep_alive`'s queue holds besides events."""


_BEAT, _END = _Mark(), _Mark()


class _Failed(_Mark):
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _read_into(events: AsyncIterator[str], queue: asyncio.Queue[str | _Mark]) -> None:
    try:
        async for event in events:
            queue.put_nowait(event)
    except BaseException as exc:  # the reader's to raise, after the events before it
        queue.put_nowait(_Failed(exc))
        if not isinstance(exc, Exception):
            raise  # this task's own cancellation
    else:
        queue.put_nowait(_END)


class _Silence:
    """A heartbeat into `queue` when nothing was sent for `interval_s`: one timer, moved on
    only when it fires (not armed again for every event)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | _Mark], interval_s: float
    ) -> None:
        self._loop, self._queue, self._interval_s = loop, queue, interval_s
        self._since = loop.time()
        self._timer = loop.call_at(self._since + interval_s, self._check)

    def broken(self) -> None:
        self._since = self._loop.time()

    def cancel(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        if now - self._since >= self._interval_s:
            if self._queue.empty():
                self._queue.put_nowait(_BEAT)
            self._since = now
        self._timer = self._loop.call_at(self._since + self._interval_s, self._check)


def sse_response(
    events: AsyncIterator[str], headers: dict[str, str] | None = None
) -> StreamingResponse:
    """Stream framed events. Starlette cancels the iteration when the client disconnects, which
    closes the engine's event stream and so aborts the request."""
    return StreamingResponse(
        events, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
    )


class ClientGone(Exception):
    """The client disconnected before a non-streaming response was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so aborting its generation) if the client disconnects
    first. Non-streaming responses need this: nothing else notices a vanished client."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone()
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
