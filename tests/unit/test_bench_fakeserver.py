"""The fake OpenAI-compatible SSE server the bench tests run against, and tests of the fake
itself: its token counts, its cached_tokens — the longest prefix the same session (or, without
one, any anonymous request) sent before — its requests in flight and its cache counters, so a
bench test that relies on them relies on something proven."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from semantic.cache.pages.prefix import common_prefix
from semantic_bench.server import free_port
from semantic_bench.workload import chat_body, stream_chat

COLD_DELAY_S = 0.15  # the fake "prefills" a prompt with nothing cached this long
WARM_DELAY_S = 0.01
TOKEN_DELAY_S = 0.002
TOKENS_PER_WORD = 1.5
TEMPLATE_TOKENS = 7
HOLD_TIMEOUT_S = 5.0  # the most a request waits for `hold_until` company

Word = tuple[str, str]  # (role, word): a prompt as the fake compares prefixes


def prompt_words(messages: list[dict[str, str]]) -> list[Word]:
    return [(m["role"], word) for m in messages for word in m["content"].split()]


def fresh_totals() -> dict[str, Any]:
    """`/admin/cache` totals as semantic shapes them, all zero."""
    counts = ["hit_tokens_memory", "hit_tokens_disk", "miss_tokens", "evicted_to_disk"]
    counts += ["restored", "evicted_from_disk", "persisted"]
    return dict.fromkeys(counts, 0) | {"miss_reasons": {}, "disk_files": 0, "disk_bytes": 0}


@dataclass
class FakeServer:
    """A stand-in OpenAI server: 1.5 tokens per word plus 7 for the template; cached_tokens =
        the longest word prefix this session (or, with none, any anonymous request) sent before, in
        the same tokens (0 if none); a slow first token when nothing was cached. Records every
        request body and the most requests it had in flight at once; with `hold_until`, it answers
    no request until that many were in flight at once (or `HOLD_TIMEOUT_S` passed), so only a
    client that really sends them together is answered quickly. `/admin/cache` (unless
        `admin_cache` is False) counts the prompt tokens it served as memory hits and misses, with
        `nothing_cached` as the reason of a miss; `totals` can be seeded. A request whose last
        message contains `fail_marker` gets a 500. Model `no-usage` streams no usage, as
        llama-cpp-python does; unstreamed, it answers with usage alone."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, list[list[Word]]] = field(default_factory=dict)
    admin_cache: bool = True
    totals: dict[str, Any] = field(default_factory=fresh_totals)
    fail_marker: str | None = None
    hold_until: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    gates: dict[int, asyncio.Event] = field(default_factory=dict)  # by `hold_until`

    def app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/health/ready", lambda _: JSONResponse({"status": "ready"})),
            Route("/admin/cache", self.cache),
        ]
        return Starlette(routes=routes)

    async def cache(self, request: Request) -> Response:
        if not self.admin_cache:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse({"totals": self.totals, "agents": []})

    def count(self, prompt: int, cached: int) -> None:
        self.totals["hit_tokens_memory"] += cached
        self.totals["miss_tokens"] += prompt - cached
        if cached == 0:
            reasons = self.totals["miss_reasons"]
            reasons["nothing_cached"] = reasons.get("nothing_cached", 0) + 1

    def cached(self, session_id: str, words: list[Word], prompt: int) -> int:
        earlier = self.seen.setdefault(session_id, [])
        longest = max((common_prefix(words, old) for old in earlier), default=0)
        earlier.append(words)
        return min(TEMPLATE_TOKENS + int(longest * TOKENS_PER_WORD), prompt - 1) if longest else 0

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        if body["model"] == "refuse":
            return JSONResponse({"error": {"message": "no such model"}}, status_code=404)
        if self.fail_marker and self.fail_marker in body["messages"][-1]["content"]:
            return JSONResponse({"error": {"message": "the fake failed"}}, status_code=500)
        words = prompt_words(body["messages"])
        prompt = TEMPLATE_TOKENS + int(len(words) * TOKENS_PER_WORD)
        cached = self.cached(body.get("session_id", ""), words, prompt)
        self.count(prompt, cached)
        delay = WARM_DELAY_S if cached else COLD_DELAY_S
        if body.get("stream") is False:
            return JSONResponse({"choices": [], "usage": {"prompt_tokens": prompt}})
        events = self.events(body, prompt, cached, delay)
        return StreamingResponse(events, media_type="text/event-stream")

    async def events(
        self, body: dict[str, Any], prompt: int, cached: int, delay: float
    ) -> AsyncIterator[str]:
        """`stream`, counted in flight from its first event to its last (or its abort)."""
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await self.hold()
            async for event in self.stream(body, prompt, cached, delay):
                yield event
        finally:
            self.in_flight -= 1

    async def hold(self) -> None:
        """Wait until `hold_until` requests are in flight at once (or `HOLD_TIMEOUT_S` passed).
        Each value has its own gate, so raising `hold_until` mid-test holds the requests after."""
        gate = self.gates.setdefault(self.hold_until, asyncio.Event())
        if self.in_flight >= self.hold_until:
            gate.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gate.wait(), HOLD_TIMEOUT_S)

    async def stream(
        self, body: dict[str, Any], prompt: int, cached: int, delay: float
    ) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return f"data: {json.dumps({'choices': [choice]})}\n\n"

        yield chunk({"role": "assistant", "content": ""})  # no content yet: not the first token
        yield ": keep-alive\n\n"
        await asyncio.sleep(delay)
        if body["model"] == "broken":
            yield 'data: {"error": {"message": "engine failed"}}\n\n'
            return
        for i in range(body["max_tokens"]):
            yield chunk({"content": f"w{i} "})
            await asyncio.sleep(TOKEN_DELAY_S)
        yield chunk({}, finish="length")
        if body["model"] == "no-usage":
            yield "data: [DONE]\n\n"
            return
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": body["max_tokens"],
            "total_tokens": prompt + body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


@contextmanager
def running(server: FakeServer) -> Iterator[FakeServer]:
    """Serve `server` on a free port in a thread for the duration of the block."""
    port = free_port()
    config = uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="error")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # a hang guard: a loaded machine starts it later
    while not runner.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        runner.should_exit = True
        thread.join(timeout=5)


def run_with_client(fake: FakeServer, work: Any) -> Any:
    """Run `work(client)` in a fresh event loop with a client bound to the fake server."""

    async def main() -> Any:
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
            return await work(client)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with running(FakeServer()) as server:
        yield server


def test_the_fake_reports_the_longest_prefix_the_session_sent_before_as_cached(
    fake: FakeServer,
) -> None:
    first = [{"role": "system", "content": "a b c d"}, {"role": "user", "content": "e f"}]
    longer = [*first, {"role": "assistant", "content": "g"}, {"role": "user", "content": "h i"}]
    other = [{"role": "system", "content": "z b c d"}, {"role": "user", "content": "e f"}]

    async def send(client: httpx.AsyncClient) -> list[tuple[int, int | None]]:
        out = []
        for messages, session in ((first, "s1"), (longer, "s1"), (first, "s2"), (other, "s1")):
            reply = await stream_chat(client, chat_body("m", messages, 1, session))
            out.append((reply.prompt_tokens, reply.cached_tokens))
        return out

    replies = run_with_client(fake, send)
    assert replies[0] == (TEMPLATE_TOKENS + 9, 0)
    assert replies[1] == (TEMPLATE_TOKENS + 13, TEMPLATE_TOKENS + 9)  # all of the first prompt
    assert replies[2] == (TEMPLATE_TOKENS + 9, 0)  # another session: nothing
    assert replies[3] == (TEMPLATE_TOKENS + 9, 0)  # the first word differs: nothing


def test_the_fake_shares_anonymous_prefixes_counts_its_cache_and_its_streams_in_flight() -> None:
    first = [{"role": "user", "content": "a b c d"}]
    longer = [*first, {"role": "assistant", "content": "e"}, {"role": "user", "content": "f"}]

    async def send(client: httpx.AsyncClient) -> list[int | None]:
        cold = await stream_chat(client, chat_body("m", first, 1, None))
        server.hold_until = 2  # the pair below is answered only once both are in
        pair = await asyncio.gather(
            *(stream_chat(client, chat_body("m", longer, 1, None)) for _ in range(2))
        )
        return [cold.cached_tokens, *sorted(reply.cached_tokens or 0 for reply in pair)]

    with running(FakeServer()) as server:
        cached = run_with_client(server, send)
        totals = httpx.get(f"{server.url}/admin/cache").json()["totals"]
        assert "session_id" not in server.bodies[0]
        assert server.peak_in_flight == 2 and server.in_flight == 0
    # No session: one pool. One of the pair finds the first prompt; the other finds that one,
    # all of it but the one token the fake always leaves to prefill.
    assert cached == [0, TEMPLATE_TOKENS + 6, TEMPLATE_TOKENS + 8]
    prompts = TEMPLATE_TOKENS + 6 + 2 * (TEMPLATE_TOKENS + 9)
    assert totals["hit_tokens_memory"] == 2 * TEMPLATE_TOKENS + 14
    assert totals["hit_tokens_memory"] + totals["miss_tokens"] == prompts
    assert totals["miss_reasons"] == {"nothing_cached": 1}
    with running(FakeServer(admin_cache=False)) as server:
        assert httpx.get(f"{server.url}/admin/cache").status_code == 404
